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

// weights: w_i >= 0 for the n candidates (0 excludes a token, e.g. the heavy
// ones); scratch.block_sums must hold the sum of every 32 weights (block level
// of the hierarchy). Appends the unique sampled tokens (base + j) and their
// log pi to *out, sets out->draws and out->unique. Returns the sum of weights.
double sample_residual(const float* weights, size_t n, uint32_t base, uint64_t m, float pi_min,
                       const RngStream& rng, SelectScratch& scratch, Selection* out);

// Fills scratch.block_sums with the sums of every 32 weights.
void compute_block_sums(const float* weights, size_t n, SelectScratch& scratch);

}  // namespace ssa
