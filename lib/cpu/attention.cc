#include "attention.h"

#include <math.h>

#include <algorithm>

#include "common/online_softmax.h"
#include "simd.h"

namespace ssa {
namespace {

constexpr size_t kBlock = 16;  // tokens scored before one rescale of the accumulator

// Folds a block of logits (with their V rows) into a partial: one rescale per block.
inline void fold_block(const float* logits, const uint8_t* const* v_rows, size_t n, DType v_type,
                       uint32_t d, AttnPartial* part) {
  float bm = -INFINITY;
  for (size_t i = 0; i < n; ++i) bm = std::max(bm, logits[i]);
  if (bm == -INFINITY) return;
  const auto& k = simd::kernels();
  if (bm > part->m) {
    const float scale = part->m == -INFINITY ? 0.0f : expf(part->m - bm);
    if (scale != 1.0f) {
      for (float& a : part->acc) a *= scale;
    }
    part->l *= scale;
    part->m = bm;
  }
  for (size_t i = 0; i < n; ++i) {
    const float w = expf(logits[i] - part->m);
    part->l += w;
    k.axpy(v_type, v_rows[i], w, part->acc.data(), d);
  }
}

}  // namespace

void AttnPartial::merge(const AttnPartial& other) {
  float fa, fb;
  const SoftmaxScale s = lse_merge(SoftmaxScale{m, l}, SoftmaxScale{other.m, other.l}, &fa, &fb);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] * fa + other.acc[i] * fb;
  m = s.m;
  l = s.l;
}

void AttnPartial::finish(float* out) const {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (size_t i = 0; i < acc.size(); ++i) out[i] = acc[i] * inv;
}

void attend_range(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                  const float* q, uint32_t g, uint64_t t0, uint64_t t1, AttnPartial* parts) {
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  // Rows are widened to float once per block and reused by all g query heads of
  // the group: the conversion is then paid once per row, not once per head.
  thread_local std::vector<float> kf, vf;
  kf.resize(kBlock * d);
  vf.resize(kBlock * d);
  float logits[kBlock];
  const uint8_t* v_rows[kBlock];
  for (uint64_t t = t0; t < t1;) {
    // A block never crosses a page, so its rows are contiguous per head.
    const uint64_t page = t / P;
    const uint64_t end = std::min<uint64_t>({t1, (page + 1) * P, t + kBlock});
    const size_t n = static_cast<size_t>(end - t);
    const uint8_t* base = layer.kv_pages[page]->data();
    const uint32_t slot = static_cast<uint32_t>(t % P);
    k.to_f32(layout.dtype, base + layout.k_offset(kv_head, slot), kf.data(), n * d);
    k.to_f32(layout.dtype, base + layout.v_offset(kv_head, slot), vf.data(), n * d);
    for (size_t i = 0; i < n; ++i) v_rows[i] = reinterpret_cast<const uint8_t*>(vf.data() + i * d);
    for (uint32_t h = 0; h < g; ++h) {
      for (size_t i = 0; i < n; ++i) logits[i] = k.dot(DType::kF32, kf.data() + i * d, q + size_t{h} * d, d);
      fold_block(logits, v_rows, n, DType::kF32, d, &parts[h]);
    }
    t = end;
  }
}

void attend_group_entries(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                          const float* q, const GroupEntry* entries, size_t n, AttnPartial* parts) {
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  thread_local std::vector<float> kf, vf;
  kf.resize(d);
  vf.resize(d);
  for (size_t i = 0; i < n;) {
    const uint32_t t = entries[i].token;
    if (i + 8 < n) {  // the gather is latency-bound: start the next rows early
      const uint32_t nt = entries[i + 8].token;
      const uint8_t* nb = layer.kv_pages[nt / P]->data();
      __builtin_prefetch(nb + layout.k_offset(kv_head, nt % P));
      __builtin_prefetch(nb + layout.v_offset(kv_head, nt % P));
    }
    const uint8_t* base = layer.kv_pages[t / P]->data();
    k.to_f32(layout.dtype, base + layout.k_offset(kv_head, t % P), kf.data(), d);
    k.to_f32(layout.dtype, base + layout.v_offset(kv_head, t % P), vf.data(), d);
    for (; i < n && entries[i].token == t; ++i) {
      AttnPartial& part = parts[entries[i].head];
      const float logit =
          k.dot(DType::kF32, kf.data(), q + size_t{entries[i].head} * d, d) - entries[i].log_pi;
      if (logit > part.m) {
        const float scale = part.m == -INFINITY ? 0.0f : expf(part.m - logit);
        for (float& a : part.acc) a *= scale;
        part.l *= scale;
        part.m = logit;
      }
      const float w = expf(logit - part.m);
      part.l += w;
      k.axpy(DType::kF32, vf.data(), w, part.acc.data(), d);
    }
  }
}

}  // namespace ssa
