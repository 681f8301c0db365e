#include "attention.h"

#include <math.h>

#include <algorithm>

#include "common/online_softmax.h"
#include "simd.h"

namespace ssa {
namespace {

constexpr size_t kBlock = 16;  // tokens scored before one rescale of the accumulator

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

namespace {

// The g heads' online-softmax states gathered into flat arrays for attend_block
// (and written back by flush), so each block of rows is widened once for all g.
struct GroupState {
  std::vector<float> m, l, acc;
  GroupState(const AttnPartial* parts, uint32_t g, uint32_t d) : m(g), l(g), acc(size_t{g} * d) {
    for (uint32_t h = 0; h < g; ++h) {
      m[h] = parts[h].m;
      l[h] = parts[h].l;
      std::copy(parts[h].acc.begin(), parts[h].acc.end(), acc.begin() + size_t{h} * d);
    }
  }
  void flush(AttnPartial* parts, uint32_t g, uint32_t d) const {
    for (uint32_t h = 0; h < g; ++h) {
      parts[h].m = m[h];
      parts[h].l = l[h];
      std::copy(acc.begin() + size_t{h} * d, acc.begin() + size_t{h + 1} * d, parts[h].acc.begin());
    }
  }
};

}  // namespace

void attend_range(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                  const float* q, uint32_t g, uint64_t t0, uint64_t t1, AttnPartial* parts) {
  if (t0 >= t1) return;
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  thread_local std::vector<float> kf, vf;
  kf.resize(kBlock * d);
  vf.resize(kBlock * d);
  GroupState st(parts, g, d);
  for (uint64_t t = t0; t < t1;) {
    // A block never crosses a page, so its rows are contiguous per head.
    const uint64_t page = t / P;
    const uint64_t end = std::min<uint64_t>({t1, (page + 1) * P, t + kBlock});
    const size_t n = static_cast<size_t>(end - t);
    const uint8_t* base = layer.kv_pages[page]->data();
    const uint32_t slot = static_cast<uint32_t>(t % P);
    k.to_f32(layout.dtype, base + layout.k_offset(kv_head, slot), kf.data(), n * d);
    k.to_f32(layout.dtype, base + layout.v_offset(kv_head, slot), vf.data(), n * d);
    k.attend_block(kf.data(), vf.data(), n, d, q, g, nullptr, st.m.data(), st.l.data(), st.acc.data());
    t = end;
  }
  st.flush(parts, g, d);
}

void attend_shared_rows(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                        const float* q, uint32_t g, const uint32_t* tokens, const float* log_pi,
                        size_t n, AttnPartial* parts) {
  if (n == 0) return;
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  thread_local std::vector<float> kf, vf;
  kf.resize(kBlock * d);
  vf.resize(kBlock * d);
  GroupState st(parts, g, d);
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t b = std::min(kBlock, n - i);
    for (size_t r = 0; r < b; ++r) {
      const uint32_t t = tokens[i + r];
      const uint8_t* base = layer.kv_pages[t / P]->data();
      k.to_f32(layout.dtype, base + layout.k_offset(kv_head, t % P), kf.data() + r * d, d);
      k.to_f32(layout.dtype, base + layout.v_offset(kv_head, t % P), vf.data() + r * d, d);
    }
    k.attend_block(kf.data(), vf.data(), b, d, q, g, log_pi + i, st.m.data(), st.l.data(), st.acc.data());
  }
  st.flush(parts, g, d);
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
      for (size_t off = 0; off < layout.row_bytes(); off += 64) {
        __builtin_prefetch(nb + layout.k_offset(kv_head, nt % P) + off);
        __builtin_prefetch(nb + layout.v_offset(kv_head, nt % P) + off);
      }
    }
    const uint8_t* base = layer.kv_pages[t / P]->data();
    k.to_f32(layout.dtype, base + layout.k_offset(kv_head, t % P), kf.data(), d);
    k.to_f32(layout.dtype, base + layout.v_offset(kv_head, t % P), vf.data(), d);
    for (; i < n && entries[i].token == t; ++i) {
      AttnPartial& part = parts[entries[i].head];
      k.attend_block(kf.data(), vf.data(), 1, d, q + size_t{entries[i].head} * d, 1, &entries[i].log_pi,
                     &part.m, &part.l, part.acc.data());
    }
  }
}

}  // namespace ssa
