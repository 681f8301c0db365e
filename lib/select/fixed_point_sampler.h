// The residual sampler of select_tokens and of the sharded decode, in fixed
// point so that its sums are exact (docs/SHARDING.md#same-estimator).
//
// A residual weight w in [0, 1] (exp(s~ - max), or 1 for uniform sampling, 0 for
// heavy tokens) counts as the integer round(w * 2^38), as on the CUDA backend
// (kernels/device_util.cuh): sums of them are exact and the same in any order
// and any grouping, so the shards of a session can sum their own tokens and the
// total is the one an unsharded sum gives. The three-level hierarchy of
// common/sampling_hierarchy.h is cut at absolute token positions (block b holds
// tokens [32 b, 32 b + 32), chunk c tokens [1024 c, 1024 c + 1024), clipped to
// the candidates): shard boundaries are multiples of the chunk, so no block or
// chunk straddles two shards. A draw's three uniforms become integer targets
// floor(u * sum) (exact, below the sum), and each level takes the first entry
// whose running integer sum exceeds its target: the token drawn is a function of
// the weights and the RNG words alone, wherever the tokens live.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <utility>
#include <vector>

#include "common/fixed_weight.h"
#include "common/philox.h"

namespace ssa {

inline double fixed_to_double(uint64_t w) { return static_cast<double>(w) * (1.0 / 274877906944.0); }

// floor(sum * u) for the uniform u = (word + 0.5) / 2^32 of rng_uniform: < sum.
inline uint64_t fixed_target(uint64_t sum, uint32_t word) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(sum) * (2ull * word + 1)) >> 33);
}

// e[i] = exp(x[i] - shift) with the SIMD kernels' exponential: each element's
// value depends on x[i] and shift only, never on where the array is cut.
void proposal_weights(const float* x, size_t n, float shift, float* e);

// Sum of fixed_weight(w[i]) over n weights.
uint64_t fixed_sum(const float* w, size_t n);

// The hierarchy over the weights of tokens [first, first + n) (absolute token
// positions: they decide the cuts). Keeps a pointer to w.
class FixedHierarchy {
 public:
  void build(const float* w, uint64_t first, size_t n);
  // The same from block sums already made (proposal_pass.h's, heavy tokens
  // taken out): *blocks is taken, left empty.
  void adopt(const float* w, uint64_t first, size_t n, std::vector<uint64_t>* blocks);
  uint64_t total() const { return total_; }
  // A draw whose first-level target x (< total()) falls here, in three steps
  // (draw_range runs each for a batch of draws): the chunk (an index into this
  // range's chunks) of x, its block (an index into this range's blocks) with
  // the draw's word r1, then the block's token (absolute) with its word r2.
  size_t chunk_of(uint64_t x) const;
  uint64_t block_in_chunk(size_t c, uint32_t r1) const;
  uint64_t token_in_block(uint64_t b, uint32_t r2) const;
  // What the next step reads: chunk c's block sums, block b's weights.
  const uint64_t* block_sums_of(size_t c) const { return blocks_.data() + blocks_of_chunk(c).first; }
  const float* weights_of(uint64_t b) const { return w_ + (block_begin(b) - first_); }

 private:
  const float* w_ = nullptr;
  uint64_t first_ = 0;
  size_t n_ = 0;
  std::vector<uint64_t> blocks_, chunks_, prefix_;
  uint64_t total_ = 0;
  void sum_chunks();
  uint64_t block_begin(uint64_t b) const;
  std::pair<uint64_t, uint64_t> blocks_of_chunk(size_t c) const;  // [first, end) in blocks_
};

// Draws j in [0, m) of the stream whose first-level target floor(u0 * grand_total)
// falls in [offset, offset + h.total()): the part of the whole sample that lands
// in this hierarchy's tokens, when the hierarchies of consecutive token ranges
// are laid end to end (offset = the totals of the ranges before it). Appends the
// tokens (absolute) to *drawn, unsorted, with repeats.
void draw_range(const FixedHierarchy& h, uint64_t offset, uint64_t grand_total, uint64_t m,
                const RngStream& rng, std::vector<uint32_t>* drawn);

}  // namespace ssa
