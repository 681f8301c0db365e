// Vectorised inner loops of the CPU backend. Each has a portable version and an
// AVX2+FMA+F16C version (attend_rows also an AVX-512 one); the best one the
// running CPU supports is chosen once at start-up (no -march flags in the
// shipped build). Both give results within float
// rounding of each other; the float64 reference in reference_attention.h is the
// yardstick for both.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::simd {

struct Kernels {
  // dst[i] = float(src[i]) for n elements of dtype t.
  void (*to_f32)(DType t, const void* src, float* dst, size_t n);
  // sum_i q[i] * float(row[i]).
  float (*dot)(DType t, const void* row, const float* q, size_t n);
  // out[i] = sum_m lut[m * K + codes[m * stride + i]] for i < count; lut is
  // [M][K] floats, codes holds M rows of `stride` bytes (subspace-major).
  void (*pq_scores)(const float* lut, uint32_t K, uint32_t M, const uint8_t* codes,
                    size_t stride, size_t count, float* out);
  // The 4-bit proxy's scores from its 8-bit table: for i < count,
  // out[i] = fmaf(scale, sum_m lut[m * 16 + code_m(i)], bias), the sum exact in
  // integers; lut is [M][16] bytes (M even, <= 256), codes holds M / 2 rows of
  // `stride` bytes, row r byte i = code_2r(i) | code_2r+1(i) << 4. Every
  // version gives the same bits.
  void (*pq4_scores)(const uint8_t* lut, uint32_t M, const uint8_t* codes, size_t stride, size_t count,
                     float scale, float bias, float* out);
  // out[i] = exp(x[i] - shift); returns sum of out. Relative error < 1e-6.
  // When block_sums is not null it also receives the sum of every 32 outputs
  // (the last block may be partial): the sampler's block level for free.
  double (*exp_shifted)(const float* x, float shift, float* out, size_t n, double* block_sums);
  // max_i x[i] (-inf for n = 0); x holds no NaN.
  float (*max_value)(const float* x, size_t n);
  // For b < n_blocks (>= 1): maxima[b] = max of x[32 b, 32 b + 32), and
  // sample[b] = x[32 b + sample_lane(b)]; returns the largest maximum. x holds
  // no NaN.
  float (*block_max)(const float* x, size_t n_blocks, float* maxima, float* sample);
  // The selection's one pass over whole blocks of 32 scores
  // (lib/select/proposal_pass.h). When w is not null: w[i] = exp(x[i] - shift),
  // bitwise exp_shifted's, and block_fixed[b] = the sum of fixed_weight(w[i])
  // over block b (common/fixed_weight.h; exact integers). And always: the
  // indices index_base + i of the x[i] >= threshold, in order, the first
  // cand_cap of them stored in cand. Returns how many x[i] >= threshold.
  size_t (*proposal_blocks)(const float* x, size_t n_blocks, float shift, float threshold, float* w,
                            uint64_t* block_fixed, uint32_t* cand, size_t cand_cap, uint32_t index_base);
  // argmin_c ||x - c||^2 over K centroids, computed as |c|^2 - 2 x.c with the
  // centroids transposed (cent_t[j * K + c]) and their squared norms; ties go to
  // the lower index. The AVX2 path takes K a multiple of 64 (else generic).
  uint32_t (*nearest_centroid)(const float* x, const float* cent_t, const float* norms,
                               uint32_t K, uint32_t dim);
  // Folds n <= 32 rows (kf, vf: [n][d] floats) into the online-softmax states
  // (m[h], l[h], acc[h * d]) of g query heads q[g][d]: logit = q_h . k_t -
  // offset[t] (offset may be null: 0). One rescale per head per block.
  void (*attend_block)(const float* kf, const float* vf, size_t n, uint32_t d, const float* q,
                       uint32_t g, const float* offset, float* m, float* l, float* acc);
  // attend_block over rows still in the store's dtype: n <= 32 rows, row i at
  // k_rows[i] / v_rows[i] (head_dim elements each). Each row is widened once, in
  // registers, for all g heads; the result is attend_block's on the widened rows
  // up to float rounding (the AVX2 version also takes exp from exp_shifted's
  // polynomial).
  void (*attend_rows)(DType t, const void* const* k_rows, const void* const* v_rows, size_t n,
                      uint32_t d, const float* q, uint32_t g, const float* offset, float* m, float* l,
                      float* acc);
  const char* name;
};

void pq_scores_scalar(const float* lut, uint32_t K, uint32_t M, const uint8_t* codes, size_t stride,
                      size_t count, float* out);
void pq4_scores_scalar(const uint8_t* lut, uint32_t M, const uint8_t* codes, size_t stride, size_t count,
                       float scale, float bias, float* out);
void generic_attend_block(const float* kf, const float* vf, size_t n, uint32_t d, const float* q,
                          uint32_t g, const float* offset, float* m, float* l, float* acc);
// attend_rows by widening the rows into float buffers and calling `block`.
void widen_and_attend(void (*to_f32)(DType, const void*, float*, size_t),
                      void (*block)(const float*, const float*, size_t, uint32_t, const float*, uint32_t,
                                    const float*, float*, float*, float*),
                      DType t, const void* const* k_rows, const void* const* v_rows, size_t n, uint32_t d,
                      const float* q, uint32_t g, const float* offset, float* m, float* l, float* acc);
uint32_t generic_nearest_centroid(const float* x, const float* cent_t, const float* norms,
                                  uint32_t K, uint32_t dim);

// The element of block b that block_max samples: every lane in turn (13 is odd),
// so scores that repeat with the block's period do not bias the sample.
inline uint32_t sample_lane(size_t b) { return static_cast<uint32_t>(b * 13 % 32); }

// The kernels for this CPU: AVX-512 where available, else AVX2, else portable;
// SSA_SIMD=generic or SSA_SIMD=avx2 caps the choice.
const Kernels& kernels();
// The portable kernels (for tests comparing both).
const Kernels& generic_kernels();
// The AVX2 kernels, or nullptr if the CPU lacks AVX2/FMA/F16C.
const Kernels* avx2_kernels();
// The AVX2 kernels with the AVX-512 attend_rows, or nullptr if the CPU lacks
// AVX-512 F/BW (or AVX2).
const Kernels* avx512_kernels();

}  // namespace ssa::simd
