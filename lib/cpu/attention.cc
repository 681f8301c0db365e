#include "attention.h"

#include <math.h>

#include <algorithm>

#include "common/online_softmax.h"
#include "simd.h"

namespace ssa {
namespace {

constexpr size_t kBlock = 32;  // rows scored before one rescale of the accumulator (attend_rows' limit)

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

// The g heads' online-softmax states gathered into flat arrays for attend_rows
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

namespace {

// Starts loading the K and V rows of `tokens` (the next block): the gathers of
// selected rows are latency-bound without it.
void prefetch_rows(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const uint32_t* tokens,
                   size_t n) {
  const uint32_t P = layout.page_tokens;
  for (size_t r = 0; r < n; ++r) {
    const uint8_t* base = layer.kv_pages[tokens[r] / P]->data();
    const uint8_t* kr = base + layout.k_offset(kv_head, tokens[r] % P);
    const uint8_t* vr = base + layout.v_offset(kv_head, tokens[r] % P);
    for (size_t off = 0; off < layout.row_bytes(); off += 64) {
      __builtin_prefetch(kr + off);
      __builtin_prefetch(vr + off);
    }
  }
}

}  // namespace

void attend_range(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                  const float* q, uint32_t g, uint64_t t0, uint64_t t1, AttnPartial* parts) {
  if (t0 >= t1) return;
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  const void* k_rows[kBlock];
  const void* v_rows[kBlock];
  GroupState st(parts, g, d);
  for (uint64_t t = t0; t < t1;) {
    // A block never crosses a page, so its rows are contiguous per head.
    const uint64_t page = t / P;
    const uint64_t end = std::min<uint64_t>({t1, (page + 1) * P, t + kBlock});
    const size_t n = static_cast<size_t>(end - t);
    const uint8_t* base = layer.kv_pages[page]->data();
    const uint32_t slot = static_cast<uint32_t>(t % P);
    for (size_t r = 0; r < n; ++r) {
      k_rows[r] = base + layout.k_offset(kv_head, slot + static_cast<uint32_t>(r));
      v_rows[r] = base + layout.v_offset(kv_head, slot + static_cast<uint32_t>(r));
    }
    k.attend_rows(layout.dtype, k_rows, v_rows, n, d, q, g, nullptr, st.m.data(), st.l.data(), st.acc.data());
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
  const void* k_rows[kBlock];
  const void* v_rows[kBlock];
  GroupState st(parts, g, d);
  prefetch_rows(layout, layer, kv_head, tokens, std::min(kBlock, n));
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t b = std::min(kBlock, n - i);
    if (i + b < n) prefetch_rows(layout, layer, kv_head, tokens + i + b, std::min(kBlock, n - i - b));
    for (size_t r = 0; r < b; ++r) {
      const uint32_t t = tokens[i + r];
      const uint8_t* base = layer.kv_pages[t / P]->data();
      k_rows[r] = base + layout.k_offset(kv_head, t % P);
      v_rows[r] = base + layout.v_offset(kv_head, t % P);
    }
    k.attend_rows(layout.dtype, k_rows, v_rows, b, d, q, g, log_pi + i, st.m.data(), st.l.data(),
                  st.acc.data());
  }
  st.flush(parts, g, d);
}

void attend_group_entries(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                          const float* q, uint32_t g, const GroupEntry* entries, size_t n,
                          AttnPartial* parts) {
  const auto& k = simd::kernels();
  const uint32_t P = layout.page_tokens, d = layout.head_dim;
  // Each head's rows are folded in blocks of its own; in token order, a row that
  // several heads selected is still in cache when the later heads read it.
  struct Pending {
    const void* k_rows[kBlock];
    const void* v_rows[kBlock];
    float log_pi[kBlock];
    size_t n = 0;
  };
  thread_local std::vector<Pending> pending;
  pending.assign(g, Pending{});
  auto flush = [&](uint32_t h) {
    Pending& p = pending[h];
    AttnPartial& part = parts[h];
    k.attend_rows(layout.dtype, p.k_rows, p.v_rows, p.n, d, q + size_t{h} * d, 1, p.log_pi, &part.m, &part.l,
                  part.acc.data());
    p.n = 0;
  };
  constexpr size_t kAhead = 16;  // entries between a prefetch and the use of its row
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && entries[i + kAhead].token != entries[i + kAhead - 1].token) {
      prefetch_rows(layout, layer, kv_head, &entries[i + kAhead].token, 1);
    }
    const GroupEntry& e = entries[i];
    const uint8_t* base = layer.kv_pages[e.token / P]->data();
    Pending& p = pending[e.head];
    p.k_rows[p.n] = base + layout.k_offset(kv_head, e.token % P);
    p.v_rows[p.n] = base + layout.v_offset(kv_head, e.token % P);
    p.log_pi[p.n] = e.log_pi;
    if (++p.n == kBlock) flush(e.head);
  }
  for (uint32_t h = 0; h < g; ++h) {
    if (pending[h].n > 0) flush(h);
  }
}

}  // namespace ssa
