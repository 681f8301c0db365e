// Sampling the residual R with replacement: m draws, each token with probability
// p_i = w_i / sum_R w, through the chunk/block/token hierarchy of
// common/sampling_hierarchy.h; duplicates are read once and each unique token
// gets pi_i = 1 - (1 - p_i)^m (clamped at pi_min).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/philox.h"
#include "selection.h"

namespace ssa {

// One draw at a time from the hierarchy over fixed weights. Draw j of a stream
// is a pure function of (stream, j, weights), so a caller may stop, look at what
// it drew, and continue the same stream later (the error-targeted decode does).
struct HierarchySampler {
  const float* weights = nullptr;
  size_t n = 0, n_blocks = 0, n_chunks = 0;
  const double* blocks = nullptr;  // sums of every 32 weights
  const double* chunks = nullptr;  // sums of every 1024 weights
  const double* prefix = nullptr;  // inclusive prefix sums of the chunks
  double total = 0.0;              // sum of all weights; draws need total > 0

  // Candidate index (0..n) of draw `index` of the stream.
  uint32_t draw(const RngStream& rng, uint32_t index) const;
};

// A sampler over weights[0..n) whose block sums are in scratch.block_sums; fills
// scratch.chunk_sums and scratch.chunk_prefix, which it then points into (as
// into weights): they must stay unchanged while the sampler is used.
HierarchySampler build_sampler(const float* weights, size_t n, SelectScratch& scratch);

// weights: w_i >= 0 for the n candidates (0 excludes a token, e.g. the heavy
// ones); scratch.block_sums must hold the sum of every 32 weights (block level
// of the hierarchy). Appends the unique sampled tokens (base + j) and their
// log pi to *out, sets out->draws and out->unique. Returns the sum of weights.
double sample_residual(const float* weights, size_t n, uint32_t base, uint64_t m, float pi_min,
                       const RngStream& rng, SelectScratch& scratch, Selection* out);

// Fills scratch.block_sums with the sums of every 32 weights.
void compute_block_sums(const float* weights, size_t n, SelectScratch& scratch);

// Sets scratch.block_sums[b] to the exact sum of the weights of block b again
// (after some of them were zeroed).
void resum_block(const float* weights, size_t n, size_t b, SelectScratch& scratch);

}  // namespace ssa
