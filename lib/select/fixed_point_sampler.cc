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
  blocks_.clear();
  if (n > 0) {
    const uint64_t b0 = first / kBlockTokens, b1 = (first + n - 1) / kBlockTokens + 1;
    blocks_.assign(b1 - b0, 0);
    // A block at a time (the sums are integers: the grouping changes nothing).
    for (size_t i = 0; i < n;) {
      const uint64_t block = (first + i) / kBlockTokens;
      const size_t end = static_cast<size_t>(std::min<uint64_t>(n, (block + 1) * kBlockTokens - first));
      uint64_t sum = 0;
      for (; i < end; ++i) sum += fixed_weight(w[i]);
      blocks_[block - b0] = sum;
    }
  }
  sum_chunks();
}

void FixedHierarchy::adopt(const float* w, uint64_t first, size_t n, std::vector<uint64_t>* blocks) {
  w_ = w;
  first_ = first;
  n_ = n;
  blocks_.swap(*blocks);
  blocks->clear();
  sum_chunks();
}

void FixedHierarchy::sum_chunks() {
  total_ = 0;
  chunks_.clear();
  prefix_.clear();
  if (n_ == 0) return;
  const uint64_t b0 = first_ / kBlockTokens;
  const uint64_t c0 = first_ / kChunkTokens, c1 = (first_ + n_ - 1) / kChunkTokens + 1;
  chunks_.assign(c1 - c0, 0);
  prefix_.resize(c1 - c0);
  for (size_t b = 0; b < blocks_.size(); ++b) chunks_[(b0 + b) / kBlocksPerChunk - c0] += blocks_[b];
  for (size_t c = 0; c < chunks_.size(); ++c) {
    total_ += chunks_[c];
    prefix_[c] = total_;
  }
}

size_t FixedHierarchy::chunk_of(uint64_t x) const {
  // The first chunk whose inclusive prefix exceeds x (it has weight: x < total).
  // A binary search without branches: a draw's comparisons are coin flips, and
  // mispredicting them cost more than the rest of the draw.
  const uint64_t* lo = prefix_.data();
  for (size_t len = prefix_.size(); len > 1;) {
    const size_t half = len / 2;
    lo += static_cast<size_t>(lo[half - 1] <= x) * half;
    len -= half;
  }
  return static_cast<size_t>(lo - prefix_.data()) + (*lo <= x ? 1 : 0);
}

std::pair<uint64_t, uint64_t> FixedHierarchy::blocks_of_chunk(size_t c) const {
  const uint64_t b0 = first_ / kBlockTokens, c_abs = first_ / kChunkTokens + c;
  return {std::max(c_abs * kBlocksPerChunk, b0) - b0,
          std::min<uint64_t>((c_abs + 1) * kBlocksPerChunk - b0, blocks_.size())};
}

uint64_t FixedHierarchy::block_in_chunk(size_t c, uint32_t r1) const {
  // The first block whose running sum exceeds t1 (the last one at most). The
  // running sums never fall, so that is the first block plus how many of the
  // others' do not exceed it: counted without a branch per block.
  const auto [bb, be] = blocks_of_chunk(c);
  const uint64_t t1 = fixed_target(chunks_[c], r1);
  uint64_t run = 0, below = 0;
  for (uint64_t b = bb; b + 1 < be; ++b) {
    run += blocks_[b];
    below += run <= t1;
  }
  return bb + below;
}

uint64_t FixedHierarchy::block_begin(uint64_t b) const {
  return std::max((first_ / kBlockTokens + b) * kBlockTokens, first_);
}

uint64_t FixedHierarchy::token_in_block(uint64_t b, uint32_t r2) const {
  // Its tokens, clipped to this range.
  const uint64_t tb = block_begin(b), te = std::min((first_ / kBlockTokens + b + 1) * kBlockTokens, first_ + n_);
  // As for the block: the first token whose running sum exceeds t2.
  const uint64_t t2 = fixed_target(blocks_[b], r2);
  const float* w = w_ + (tb - first_);
  uint64_t run = 0, below = 0;
  for (uint64_t i = 0; tb + i + 1 < te; ++i) {
    run += fixed_weight(w[i]);
    below += run <= t2;
  }
  return tb + below;
}

void draw_range(const FixedHierarchy& h, uint64_t offset, uint64_t grand_total, uint64_t m,
                const RngStream& rng, std::vector<uint32_t>* drawn) {
  if (h.total() == 0) return;
  // Draws go in batches, each level of the hierarchy for the whole batch before
  // the next, the next level's data fetched ahead: a chunk's block sums and a
  // block's weights are each one random read of arrays far larger than the
  // caches, and one draw at a time each waited for its own.
  constexpr uint32_t kBatch = 16;
  size_t chunk[kBatch];
  uint64_t block[kBatch];
  uint32_t word1[kBatch], word2[kBatch];
  uint32_t queued = 0;
  auto flush = [&] {
    for (uint32_t i = 0; i < queued; ++i) {
      block[i] = h.block_in_chunk(chunk[i], word1[i]);
      const float* wb = h.weights_of(block[i]);
      __builtin_prefetch(wb);
      __builtin_prefetch(wb + kBlockTokens - 1);
    }
    for (uint32_t i = 0; i < queued; ++i) drawn->push_back(static_cast<uint32_t>(h.token_in_block(block[i], word2[i])));
    queued = 0;
  };
  for (uint64_t j = 0; j < m; ++j) {
    const Philox4 r = rng_draw(rng, static_cast<uint32_t>(j));
    const uint64_t x = fixed_target(grand_total, r.v[0]);
    if (x < offset || x - offset >= h.total()) continue;
    chunk[queued] = h.chunk_of(x - offset);
    word1[queued] = r.v[1];
    word2[queued] = r.v[2];
    const uint64_t* sums = h.block_sums_of(chunk[queued]);
    for (uint32_t line = 0; line < kBlocksPerChunk; line += 8) __builtin_prefetch(sums + line);
    if (++queued == kBatch) flush();
  }
  flush();
}

}  // namespace ssa
