#include "fixed_point_sampler.h"

#include <math.h>

#include <algorithm>

#include "common/sampling_hierarchy.h"
#include "cpu/simd.h"

namespace ssa {

void proposal_weights(const float* x, size_t n, float shift, float* e) {
  // The vector kernel's exponential differs in the last bits from the scalar
  // one it uses for a partial block: the tail goes through a padded block, so
  // every element takes the vector path.
  const auto& kern = simd::kernels();
  const size_t whole = n / kBlockTokens * kBlockTokens;
  if (whole > 0) kern.exp_shifted(x, shift, e, whole, nullptr);
  if (whole == n) return;
  float xin[kBlockTokens], out[kBlockTokens];
  for (size_t i = 0; i < kBlockTokens; ++i) xin[i] = whole + i < n ? x[whole + i] : shift;
  kern.exp_shifted(xin, shift, out, kBlockTokens, nullptr);
  std::copy(out, out + (n - whole), e + whole);
}

uint64_t fixed_sum(const float* w, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += fixed_weight(w[i]);
  return s;
}

void FixedHierarchy::build(const float* w, uint64_t first, size_t n) {
  w_ = w;
  first_ = first;
  n_ = n;
  total_ = 0;
  blocks_.clear();
  chunks_.clear();
  prefix_.clear();
  if (n == 0) return;
  const uint64_t b0 = first / kBlockTokens, b1 = (first + n - 1) / kBlockTokens + 1;
  const uint64_t c0 = first / kChunkTokens, c1 = (first + n - 1) / kChunkTokens + 1;
  blocks_.assign(b1 - b0, 0);
  chunks_.assign(c1 - c0, 0);
  prefix_.resize(c1 - c0);
  // A block at a time (the sums are integers: the grouping changes nothing).
  for (size_t i = 0; i < n;) {
    const uint64_t block = (first + i) / kBlockTokens;
    const size_t end = static_cast<size_t>(std::min<uint64_t>(n, (block + 1) * kBlockTokens - first));
    uint64_t sum = 0;
    for (; i < end; ++i) sum += fixed_weight(w[i]);
    blocks_[block - b0] = sum;
    chunks_[block / kBlocksPerChunk - c0] += sum;
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    total_ += chunks_[c];
    prefix_[c] = total_;
  }
}

uint64_t FixedHierarchy::pick(uint64_t x, uint32_t r1, uint32_t r2) const {
  // Chunk: the first whose inclusive prefix exceeds x (it has weight: x < total).
  const size_t c = static_cast<size_t>(std::upper_bound(prefix_.begin(), prefix_.end(), x) - prefix_.begin());
  const uint64_t b0 = first_ / kBlockTokens, c_abs = first_ / kChunkTokens + c;
  // Its blocks, clipped to this range.
  const uint64_t bb = std::max(c_abs * kBlocksPerChunk, b0) - b0;
  const uint64_t be = std::min<uint64_t>((c_abs + 1) * kBlocksPerChunk - b0, blocks_.size());
  const uint64_t t1 = fixed_target(chunks_[c], r1);
  uint64_t run = 0, b = bb;
  for (; b + 1 < be; ++b) {
    run += blocks_[b];
    if (run > t1) break;
  }
  // Its tokens, clipped to this range.
  const uint64_t tb = std::max((b0 + b) * kBlockTokens, first_), te = std::min((b0 + b + 1) * kBlockTokens, first_ + n_);
  const uint64_t t2 = fixed_target(blocks_[b], r2);
  run = 0;
  uint64_t t = tb;
  for (; t + 1 < te; ++t) {
    run += fixed_weight(w_[t - first_]);
    if (run > t2) break;
  }
  return t;
}

void draw_range(const FixedHierarchy& h, uint64_t offset, uint64_t grand_total, uint64_t m,
                const RngStream& rng, std::vector<uint32_t>* drawn) {
  if (h.total() == 0) return;
  for (uint64_t j = 0; j < m; ++j) {
    const Philox4 r = rng_draw(rng, static_cast<uint32_t>(j));
    const uint64_t x = fixed_target(grand_total, r.v[0]);
    if (x < offset || x - offset >= h.total()) continue;
    drawn->push_back(static_cast<uint32_t>(h.pick(x - offset, r.v[1], r.v[2])));
  }
}

}  // namespace ssa
