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
// ones). Appends the unique sampled tokens (base + j) and their log pi to *out,
// sets out->draws and out->unique. Returns sum of weights.
double sample_residual(const float* weights, size_t n, uint32_t base, uint64_t m, float pi_min,
                       const RngStream& rng, SelectScratch& scratch, Selection* out);

}  // namespace ssa
