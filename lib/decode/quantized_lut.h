// The 8-bit lookup table a 4-bit proxy (SSA_PROXY_PQ4, _OPQ4) scores from
// (docs/ALGORITHM.md, section 4): small enough to live in SIMD registers, and
// summed in integers.
#pragma once

#include <stdint.h>

namespace ssa {

struct QuantizedLut {
  float scale = 0.0f, bias = 0.0f;
};

// lut: [M][K] floats (K <= 16), the float table q_m . centroid[m][c]. Writes
// out: [M][16] bytes (entries c >= K are 0, never indexed) with
//   lo_m  = min_c lut[m][c],  span = max_m max_c (lut[m][c] - lo_m),
//   scale = span / 255,       out[m][c] = floor((lut[m][c] - lo_m) / scale + 1/2)
// (computed in double: round to nearest, halves up, so 0..255), and returns
// scale and bias = sum_m lo_m (both rounded to float). A token's score
// fmaf(scale, sum_m out[m][code_m], bias) then differs from its float score
// sum_m lut[m][code_m] by at most M scale / 2 plus float rounding. One table
// for all the query's tokens: a shard scoring its own tokens gets the scores
// an unsharded decode gets. A table with no spread (span 0 or not finite)
// gives scale 0: every token scores bias.
QuantizedLut quantize_lut(const float* lut, uint32_t M, uint32_t K, uint8_t* out);

}  // namespace ssa
