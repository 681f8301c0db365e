// AVX2 + FMA + F16C versions of the kernels in simd.h. Compiled with target
// attributes so the rest of the library stays baseline x86-64.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>

#include "simd.h"

#define SSA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace ssa::simd {
namespace {

SSA_AVX2 inline __m256 load8(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kF32: return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    case DType::kF16:
      return _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    default: {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType T>
SSA_AVX2 inline __m256 load8_as(const void* p, size_t i) {
  return load8(T, p, i);  // T is a constant here: the switch folds away
}

SSA_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

SSA_AVX2 void to_f32(DType t, const void* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(t, src, i));
  for (; i < n; ++i) dst[i] = load_as_f32(src, t, i);
}

// scale * s + bias for the 8 u16 sums of s16, stored to dst[0..8).
SSA_AVX2 inline void store_scaled8(__m128i s16, __m256 scale, __m256 bias, float* dst) {
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(s16));
  _mm256_storeu_ps(dst, _mm256_fmadd_ps(scale, f, bias));
}

// 32 tokens per step. A code byte holds a pair of subspaces; each nibble selects
// one of 16 table bytes with an in-register shuffle (pshufb looks up 16 bytes
// per 128-bit lane, so each subspace's table is broadcast to both lanes). The u8
// lookups are summed in u16 lanes without unpacking them: `all` adds whole u16
// lanes (token 2k + 256 x token 2k+1, wrapping) and `odd` the high bytes, so the
// even tokens' sums are all - (odd << 8) modulo 2^16, exact as every sum is
// below 2^16 (M <= 256).
SSA_AVX2 void pq4_scores(const uint8_t* lut, uint32_t M, const uint8_t* codes, size_t stride, size_t count,
                         float scale, float bias, float* out) {
  const uint32_t rows = M / 2;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256 vscale = _mm256_set1_ps(scale), vbias = _mm256_set1_ps(bias);
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    __m256i all = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
    for (uint32_t r = 0; r < rows; ++r) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + r * stride + i));
      const __m256i t0 =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lut + 32 * r)));
      const __m256i t1 =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lut + 32 * r + 16)));
      const __m256i v0 = _mm256_shuffle_epi8(t0, _mm256_and_si256(c, low4));
      const __m256i v1 = _mm256_shuffle_epi8(t1, _mm256_and_si256(_mm256_srli_epi16(c, 4), low4));
      all = _mm256_add_epi16(all, _mm256_add_epi16(v0, v1));
      odd = _mm256_add_epi16(odd, _mm256_add_epi16(_mm256_srli_epi16(v0, 8), _mm256_srli_epi16(v1, 8)));
    }
    const __m256i even = _mm256_sub_epi16(all, _mm256_slli_epi16(odd, 8));
    // u16 lane k holds tokens 2k (even) and 2k + 1 (odd); lanes 0..7 are the
    // low 128 bits (tokens 0..15). Interleaving puts the tokens in order.
    const __m256i lo = _mm256_unpacklo_epi16(even, odd);  // tokens 0..7 | 16..23
    const __m256i hi = _mm256_unpackhi_epi16(even, odd);  // tokens 8..15 | 24..31
    store_scaled8(_mm256_castsi256_si128(lo), vscale, vbias, out + i);
    store_scaled8(_mm256_castsi256_si128(hi), vscale, vbias, out + i + 8);
    store_scaled8(_mm256_extracti128_si256(lo, 1), vscale, vbias, out + i + 16);
    store_scaled8(_mm256_extracti128_si256(hi, 1), vscale, vbias, out + i + 24);
  }
  if (i < count) pq4_scores_scalar(lut, M, codes + i, stride, count - i, scale, bias, out + i);
}

SSA_AVX2 float dot(DType t, const void* row, const float* q, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(t, row, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(t, row, i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(t, row, i), a0);
  float acc = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) acc += q[i] * load_as_f32(row, t, i);
  return acc;
}

// exp(x) for x <= 0 (after the shift), by 2^(x*log2 e) = 2^n * 2^f with a degree-6
// polynomial for 2^f on [-0.5, 0.5]; inputs below -87 flush to 0.
SSA_AVX2 inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);  // [-0.5, 0.5]
  // 2^f = exp(f ln2), Taylor/minimax-like coefficients of exp(y) with y = f ln 2.
  const __m256 y = _mm256_mul_ps(f, _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, r);
}

SSA_AVX2 double exp_shifted(const float* x, float shift, float* out, size_t n, double* block_sums) {
  const __m256 s = _mm256_set1_ps(shift);
  double sum = 0.0;
  size_t b = 0;
  for (; b + 32 <= n; b += 32) {
    // One block of 32: four vectors, summed in double (blocks of near-equal
    // weights would otherwise lose low bits that pi depends on).
    __m256d acc = _mm256_setzero_pd();
    for (size_t i = b; i < b + 32; i += 8) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
      _mm256_storeu_ps(out + i, e);
      acc = _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, acc);
    const double block = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    if (block_sums != nullptr) block_sums[b / 32] = block;
    sum += block;
  }
  if (b < n) {
    double block = 0.0;
    for (size_t i = b; i < n; ++i) {
      out[i] = expf(x[i] - shift);
      block += out[i];
    }
    if (block_sums != nullptr) block_sums[b / 32] = block;
    sum += block;
  }
  return sum;
}

SSA_AVX2 float max_value(const float* x, size_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  float m = lanes[0];
  for (int l = 1; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// 16 centroids (4-bit codes): two vectors of 8, the argmin reduced in registers.
// Encoding a 4-bit index calls this once per (token, KV head, subspace) over a
// few dimensions, so the scalar loop's 16 x dim multiply-adds and branches were
// most of an index build's time.
SSA_AVX2 uint32_t nearest_of_16(const float* x, const float* cent_t, const float* norms, uint32_t dim) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (uint32_t j = 0; j < dim; ++j) {
    const __m256 xj = _mm256_set1_ps(x[j]);
    a0 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(cent_t + size_t{j} * 16), a0);
    a1 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(cent_t + size_t{j} * 16 + 8), a1);
  }
  const __m256 two = _mm256_set1_ps(2.0f);
  const __m256 d0 = _mm256_fnmadd_ps(two, a0, _mm256_loadu_ps(norms));
  const __m256 d1 = _mm256_fnmadd_ps(two, a1, _mm256_loadu_ps(norms + 8));
  // The least distance, then the first index holding it (the scalar loop's tie rule).
  __m256 m = _mm256_min_ps(d0, d1);
  m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  const uint32_t eq = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(d0, m, _CMP_EQ_OQ))) |
                      static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(d1, m, _CMP_EQ_OQ))) << 8;
  // No lane equal only with a NaN distance, which finite centroids and keys (appends
  // refuse non-finite rows) never give.
  return eq != 0 ? static_cast<uint32_t>(__builtin_ctz(eq)) : 0u;
}

SSA_AVX2 uint32_t nearest_centroid(const float* x, const float* cent_t, const float* norms,
                                   uint32_t K, uint32_t dim) {
  if (K == 16) return nearest_of_16(x, cent_t, norms, dim);
  if (K % 64 != 0) return generic_nearest_centroid(x, cent_t, norms, K, dim);
  // 64 centroids per pass in 8 independent accumulators (hides FMA latency);
  // a per-lane running minimum with its index, reduced once at the end.
  __m256 best = _mm256_set1_ps(INFINITY);
  __m256i best_idx = _mm256_setzero_si256();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (uint32_t c0 = 0; c0 < K; c0 += 64) {
    // Eight named accumulators so they stay in registers.
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (uint32_t j = 0; j < dim; ++j) {
      const __m256 xj = _mm256_set1_ps(x[j]);
      const float* row = cent_t + size_t{j} * K + c0;
      a0 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 24), a3);
      a4 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 32), a4);
      a5 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 40), a5);
      a6 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 48), a6);
      a7 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(row + 56), a7);
    }
    const __m256 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int a = 0; a < 8; ++a) {
      const __m256 dist = _mm256_fnmadd_ps(_mm256_set1_ps(2.0f), acc[a], _mm256_loadu_ps(norms + c0 + 8 * a));
      const __m256 lt = _mm256_cmp_ps(dist, best, _CMP_LT_OQ);  // strict: earlier index wins ties
      best = _mm256_blendv_ps(best, dist, lt);
      const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(c0 + 8 * a)));
      best_idx = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(best_idx), _mm256_castsi256_ps(idx), lt));
    }
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bi), best_idx);
  uint32_t out = static_cast<uint32_t>(bi[0]);
  float out_d = bv[0];
  for (int l = 1; l < 8; ++l) {
    if (bv[l] < out_d || (bv[l] == out_d && static_cast<uint32_t>(bi[l]) < out)) {
      out_d = bv[l];
      out = static_cast<uint32_t>(bi[l]);
    }
  }
  return out;
}

// Scores of the block per head with four independent accumulators, then the V
// update with acc held in a register across all rows (8 floats at a time), so
// each accumulator element is loaded and stored once per block, not per row.
SSA_AVX2 void attend_block(const float* kf, const float* vf, size_t n, uint32_t d, const float* q,
                           uint32_t g, const float* offset, float* m, float* l, float* acc) {
  if (d % 32 != 0 || n > 32) {
    generic_attend_block(kf, vf, n, d, q, g, offset, m, l, acc);
    return;
  }
  alignas(32) float logits[32], w[32];
  for (uint32_t h = 0; h < g; ++h) {
    const float* qh = q + static_cast<size_t>(h) * d;
    float bm = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      const float* kr = kf + t * d;
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (uint32_t j = 0; j < d; j += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j), _mm256_loadu_ps(kr + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j + 8), _mm256_loadu_ps(kr + j + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j + 16), _mm256_loadu_ps(kr + j + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j + 24), _mm256_loadu_ps(kr + j + 24), s3);
      }
      logits[t] = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) -
                  (offset != nullptr ? offset[t] : 0.0f);
      bm = logits[t] > bm ? logits[t] : bm;
    }
    float* a = acc + static_cast<size_t>(h) * d;
    if (bm > m[h]) {
      const float scale = m[h] == -INFINITY ? 0.0f : expf(m[h] - bm);
      const __m256 sv = _mm256_set1_ps(scale);
      for (uint32_t j = 0; j < d; j += 8) _mm256_storeu_ps(a + j, _mm256_mul_ps(sv, _mm256_loadu_ps(a + j)));
      l[h] *= scale;
      m[h] = bm;
    }
    float lsum = 0.0f;
    for (size_t t = 0; t < n; ++t) {
      w[t] = expf(logits[t] - m[h]);
      lsum += w[t];
    }
    l[h] += lsum;
    for (uint32_t j = 0; j < d; j += 16) {
      __m256 a0 = _mm256_loadu_ps(a + j), a1 = _mm256_loadu_ps(a + j + 8);
      for (size_t t = 0; t < n; ++t) {
        const __m256 wt = _mm256_set1_ps(w[t]);
        a0 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vf + t * d + j), a0);
        a1 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vf + t * d + j + 8), a1);
      }
      _mm256_storeu_ps(a + j, a0);
      _mm256_storeu_ps(a + j + 8, a1);
    }
  }
}

// Lane i of the result = the sum of v[i]'s eight lanes.
SSA_AVX2 inline __m256 hsum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // a: sums of lanes 0-3 of v[0..3] | sums of lanes 4-7 of v[0..3]; b likewise for v[4..7].
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

SSA_AVX2 inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

SSA_AVX2 float block_max(const float* x, size_t n_blocks, float* maxima, float* sample) {
  __m256 all = _mm256_set1_ps(-INFINITY);
  for (size_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * 32;
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                   _mm256_max_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
    maxima[b] = hmax(m);
    sample[b] = xb[sample_lane(b)];
    all = _mm256_max_ps(all, m);
  }
  return hmax(all);
}

// The fixed-point weights round(w * 2^38) of four floats as 64-bit integers:
// w * 2^38 is exact in double and below 2^51, so adding 2^52 rounds it to an
// integer (to nearest even, as cvtss2si does) held in the low mantissa bits.
SSA_AVX2 inline __m256i fixed4(__m128 w) {
  const __m256d magic = _mm256_set1_pd(4503599627370496.0);  // 2^52
  const __m256d v = _mm256_fmadd_pd(_mm256_cvtps_pd(w), _mm256_set1_pd(274877906944.0), magic);
  return _mm256_sub_epi64(_mm256_castpd_si256(v), _mm256_castpd_si256(magic));
}

SSA_AVX2 size_t proposal_blocks(const float* x, size_t n_blocks, float shift, float threshold, float* w,
                                uint64_t* block_fixed, uint32_t* cand, size_t cand_cap, uint32_t index_base) {
  const __m256 s = _mm256_set1_ps(shift), t = _mm256_set1_ps(threshold);
  size_t above = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t i0 = b * 32;
    __m256i acc = _mm256_setzero_si256();
    for (size_t i = i0; i < i0 + 32; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      if (w != nullptr) {
        const __m256 e = exp_nonpositive(_mm256_sub_ps(v, s));
        _mm256_storeu_ps(w + i, e);
        acc = _mm256_add_epi64(acc, _mm256_add_epi64(fixed4(_mm256_castps256_ps128(e)),
                                                     fixed4(_mm256_extractf128_ps(e, 1))));
      }
      // Few scores pass the threshold: the mask is almost always empty.
      unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, t, _CMP_GE_OQ)));
      while (mask != 0) {
        if (above < cand_cap) cand[above] = index_base + static_cast<uint32_t>(i + __builtin_ctz(mask));
        ++above;
        mask &= mask - 1;
      }
    }
    if (w != nullptr) {
      alignas(32) uint64_t lanes[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
      block_fixed[b] = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
  }
  return above;
}

// The 8-lane ISA of the attend_rows tiles (attend_rows_tiles.inc).
struct Isa {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kChains = 8;  // independent FMA chains per loop
  template <DType T>
  SSA_AVX2 static V load(const void* p, size_t i) { return load8_as<T>(p, i); }
  SSA_AVX2 static V zero() { return _mm256_setzero_ps(); }
  SSA_AVX2 static V set1(float x) { return _mm256_set1_ps(x); }
  SSA_AVX2 static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  SSA_AVX2 static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  SSA_AVX2 static V load(const float* p) { return _mm256_load_ps(p); }
  SSA_AVX2 static void store(float* p, V v) { _mm256_store_ps(p, v); }
  SSA_AVX2 static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  SSA_AVX2 static V add(V a, V b) { return _mm256_add_ps(a, b); }
  SSA_AVX2 static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  SSA_AVX2 static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  SSA_AVX2 static V max(V a, V b) { return _mm256_max_ps(a, b); }
  SSA_AVX2 static float hsum(V v) { return simd::hsum(v); }
  SSA_AVX2 static float hmax(V v) { return simd::hmax(v); }
  SSA_AVX2 static V exp_nonpositive(V x) { return simd::exp_nonpositive(x); }
  SSA_AVX2 static void chain_sums(const V* a, float* out) { _mm256_store_ps(out, hsum8(a)); }
};

#define SSA_TILE_TARGET SSA_AVX2
#include "attend_rows_tiles.inc"
#undef SSA_TILE_TARGET

SSA_AVX2 void attend_rows(DType t, const void* const* k_rows, const void* const* v_rows, size_t n,
                          uint32_t d, const float* q, uint32_t g, const float* offset, float* m, float* l,
                          float* acc) {
  if (d % Isa::kLanes != 0 || n > kRowsMax) {
    widen_and_attend(to_f32, attend_block, t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
    return;
  }
  attend_rows_tiles(t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
}

}  // namespace

const Kernels* avx2_kernels() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  static const Kernels k{to_f32,           dot,          pq_scores_scalar, pq4_scores,   exp_shifted,
                         max_value,        block_max,    proposal_blocks,  nearest_centroid, attend_block,
                         attend_rows,      "avx2"};
  return ok ? &k : nullptr;
}

}  // namespace ssa::simd
#else
#include "simd.h"
namespace ssa::simd {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace ssa::simd
#endif
