#include <math.h>

#include "simd.h"

namespace ssa::simd {
namespace {

void to_f32(DType t, const void* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, i);
}

float dot(DType t, const void* row, const float* q, size_t n) {
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) acc += q[i] * load_as_f32(row, t, i);
  return acc;
}

void axpy(DType t, const void* row, float w, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * load_as_f32(row, t, i);
}

void pq_scores(const float* lut, uint32_t K, uint32_t M, const uint8_t* codes, size_t stride,
               size_t count, float* out) {
  for (size_t i = 0; i < count; ++i) out[i] = 0.0f;
  for (uint32_t m = 0; m < M; ++m) {
    const float* l = lut + size_t{m} * K;
    const uint8_t* c = codes + m * stride;
    for (size_t i = 0; i < count; ++i) out[i] += l[c[i]];
  }
}

double exp_shifted(const float* x, float shift, float* out, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = expf(x[i] - shift);
    sum += out[i];
  }
  return sum;
}

}  // namespace

uint32_t generic_nearest_centroid(const float* x, const float* cent_t, const float* norms,
                                  uint32_t K, uint32_t dim) {
  uint32_t best = 0;
  float best_d = INFINITY;
  for (uint32_t c = 0; c < K; ++c) {
    float acc = 0.0f;
    for (uint32_t j = 0; j < dim; ++j) acc += x[j] * cent_t[size_t{j} * K + c];
    const float d = norms[c] - 2.0f * acc;
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

const Kernels& generic_kernels() {
  static const Kernels k{to_f32, dot, axpy, pq_scores, exp_shifted, generic_nearest_centroid,
                         "generic"};
  return k;
}

}  // namespace ssa::simd
