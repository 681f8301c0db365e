#include <math.h>
#include <string.h>

#include <vector>

#include "common/fixed_weight.h"
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

double exp_shifted(const float* x, float shift, float* out, size_t n, double* block_sums) {
  double sum = 0.0;
  for (size_t b = 0; b < n; b += 32) {
    const size_t e = b + 32 < n ? b + 32 : n;
    double block = 0.0;
    for (size_t i = b; i < e; ++i) {
      out[i] = expf(x[i] - shift);
      block += out[i];
    }
    if (block_sums != nullptr) block_sums[b / 32] = block;
    sum += block;
  }
  return sum;
}

float max_value(const float* x, size_t n) {
  float m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float block_max(const float* x, size_t n_blocks, float* maxima, float* sample) {
  float all = -INFINITY;
  for (size_t b = 0; b < n_blocks; ++b) {
    maxima[b] = max_value(x + b * 32, 32);
    sample[b] = x[b * 32 + sample_lane(b)];
    all = maxima[b] > all ? maxima[b] : all;
  }
  return all;
}

size_t proposal_blocks(const float* x, size_t n_blocks, float shift, float threshold, float* w,
                       uint64_t* block_fixed, uint32_t* cand, size_t cand_cap, uint32_t index_base) {
  size_t above = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * 32;
    if (w != nullptr) {
      exp_shifted(xb, shift, w + b * 32, 32, nullptr);
      uint64_t sum = 0;
      for (size_t i = 0; i < 32; ++i) sum += fixed_weight(w[b * 32 + i]);
      block_fixed[b] = sum;
    }
    for (size_t i = 0; i < 32; ++i) {
      if (xb[i] >= threshold) {
        if (above < cand_cap) cand[above] = index_base + static_cast<uint32_t>(b * 32 + i);
        ++above;
      }
    }
  }
  return above;
}

void attend_rows(DType t, const void* const* k_rows, const void* const* v_rows, size_t n, uint32_t d,
                 const float* q, uint32_t g, const float* offset, float* m, float* l, float* acc) {
  widen_and_attend(to_f32, generic_attend_block, t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
}

}  // namespace

void widen_and_attend(void (*to_f32)(DType, const void*, float*, size_t),
                      void (*block)(const float*, const float*, size_t, uint32_t, const float*, uint32_t,
                                    const float*, float*, float*, float*),
                      DType t, const void* const* k_rows, const void* const* v_rows, size_t n, uint32_t d,
                      const float* q, uint32_t g, const float* offset, float* m, float* l, float* acc) {
  thread_local std::vector<float> kf, vf;
  kf.resize(n * d);
  vf.resize(n * d);
  for (size_t r = 0; r < n; ++r) {
    to_f32(t, k_rows[r], kf.data() + r * d, d);
    to_f32(t, v_rows[r], vf.data() + r * d, d);
  }
  block(kf.data(), vf.data(), n, d, q, g, offset, m, l, acc);
}

// Four tokens at a time in scalar registers. Measured on the AMD EPYC build
// machines: 4-way scalar lookups beat AVX2 gathers (~10 vs ~14 ns per token for
// M = 16), so the AVX2 kernel set uses this one too.
void pq_scores_scalar(const float* lut, uint32_t K, uint32_t M, const uint8_t* codes, size_t stride,
                      size_t count, float* out) {
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (uint32_t m = 0; m < M; ++m) {
      const float* l = lut + size_t{m} * K;
      const uint8_t* c = codes + m * stride + i;
      a0 += l[c[0]];
      a1 += l[c[1]];
      a2 += l[c[2]];
      a3 += l[c[3]];
    }
    out[i] = a0;
    out[i + 1] = a1;
    out[i + 2] = a2;
    out[i + 3] = a3;
  }
  for (; i < count; ++i) {
    float a = 0.0f;
    for (uint32_t m = 0; m < M; ++m) a += lut[size_t{m} * K + codes[m * stride + i]];
    out[i] = a;
  }
}

namespace {

// fmaf(a, b, c) where a * b is exact in double (a float times an integer below
// 2^24): the double sum made round-to-odd (TwoSum's error decides the sticky
// last bit), then rounded once to float, which is then the correctly rounded
// a * b + c (53 >= 24 + 2 bits). glibc's fmaf without FMA hardware switches the
// rounding mode per call; this does not.
inline float scale_add(float a, float b, float c) {
  const double p = double{a} * double{b};
  double s = p + double{c};
  const double bv = s - p;
  const double e = (p - (s - bv)) + (double{c} - bv);
  if (e != 0.0) {
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);
    if ((bits & 1u) == 0) {
      bits = (e > 0.0) == (s > 0.0) ? bits + 1 : bits - 1;  // away from s toward the exact sum
      memcpy(&s, &bits, sizeof bits);
    }
  }
  return static_cast<float>(s);
}

}  // namespace

void pq4_scores_scalar(const uint8_t* lut, uint32_t M, const uint8_t* codes, size_t stride, size_t count,
                       float scale, float bias, float* out) {
  constexpr size_t kBlock = 64;  // tokens summed together, one code row at a time
  uint32_t sum[kBlock];
  for (size_t i0 = 0; i0 < count; i0 += kBlock) {
    const size_t nb = count - i0 < kBlock ? count - i0 : kBlock;
    for (size_t j = 0; j < nb; ++j) sum[j] = 0;
    for (uint32_t r = 0; r < M / 2; ++r) {
      const uint8_t* row = codes + r * stride + i0;
      const uint8_t* lo = lut + 32 * r;
      const uint8_t* hi = lo + 16;
      for (size_t j = 0; j < nb; ++j) sum[j] += lo[row[j] & 0x0fu] + hi[row[j] >> 4];
    }
    for (size_t j = 0; j < nb; ++j) out[i0 + j] = scale_add(scale, static_cast<float>(sum[j]), bias);
  }
}

void generic_attend_block(const float* kf, const float* vf, size_t n, uint32_t d, const float* q,
                          uint32_t g, const float* offset, float* m, float* l, float* acc) {
  float logits[32];
  for (uint32_t h = 0; h < g; ++h) {
    float bm = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      float s = 0.0f;
      for (uint32_t j = 0; j < d; ++j) s += q[size_t{h} * d + j] * kf[t * d + j];
      logits[t] = s - (offset != nullptr ? offset[t] : 0.0f);
      bm = logits[t] > bm ? logits[t] : bm;
    }
    float* a = acc + size_t{h} * d;
    if (bm > m[h]) {
      const float scale = m[h] == -INFINITY ? 0.0f : expf(m[h] - bm);
      for (uint32_t j = 0; j < d; ++j) a[j] *= scale;
      l[h] *= scale;
      m[h] = bm;
    }
    for (size_t t = 0; t < n; ++t) {
      const float w = expf(logits[t] - m[h]);
      l[h] += w;
      for (uint32_t j = 0; j < d; ++j) a[j] += w * vf[t * d + j];
    }
  }
}

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
  static const Kernels k{to_f32,         dot, pq_scores_scalar, pq4_scores_scalar, exp_shifted, max_value,
                         block_max,      proposal_blocks, generic_nearest_centroid, generic_attend_block, attend_rows, "generic"};
  return k;
}

}  // namespace ssa::simd
