// AVX-512 version of attend_rows, the dense decode's inner loop: 16 lanes per
// instruction where the CPU has them (twice the AVX2 kernel's arithmetic per
// cycle, which is what bounds the dense decode on few cores). The other kernels
// are the AVX2 ones. Compiled with target attributes like simd_avx2.cc.
#if defined(__x86_64__) || defined(_M_X64)
// GCC 12's AVX-512 intrinsics start from an undefined vector (_mm512_undefined_*)
// and warn about it at every use; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <math.h>

#include "simd.h"

#define SSA_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))

namespace ssa::simd {
namespace {

template <DType T>
SSA_AVX512 inline __m512 load16(const void* p, size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
    if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// Lane i of the result = the sum of v[i]'s sixteen lanes, for eight vectors.
SSA_AVX512 inline __m256 hsum8(const __m512* v) {
  __m256 h[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[i]), 1)));
  }
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// exp(x) for x <= 0 as in simd_avx2.cc (2^n * a degree-6 polynomial of 2^f;
// below -87 flushes to 0), 16 lanes.
SSA_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 y = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

constexpr size_t kRowsMax = 32;

// Independent FMA chains per loop: twice the FMA latency times the two FMA
// pipes, so the pipes never wait on a chain (32 registers leave room for it).
constexpr int kChains = 16;

// logits[h * 32 + r] = q_h . k_r for H <= 4 heads, R = 16 / H rows at a time;
// each K vector is widened once for the H heads.
template <DType T, int H>
SSA_AVX512 void tile_scores(const void* const* k_rows, size_t n, uint32_t d, const float* q, float* logits) {
  constexpr int R = kChains / H;
  size_t r0 = 0;
  for (; r0 + R <= n; r0 += R) {
    __m512 a[kChains];
    #pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_setzero_ps();
    for (uint32_t j = 0; j < d; j += 16) {
      __m512 kv[R];
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) kv[r] = load16<T>(k_rows[r0 + r], j);
      #pragma GCC unroll 16
      for (int h = 0; h < H; ++h) {
        const __m512 qv = _mm512_loadu_ps(q + static_cast<size_t>(h) * d + j);
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) a[r * H + h] = _mm512_fmadd_ps(qv, kv[r], a[r * H + h]);
      }
    }
    alignas(32) float sums[kChains];
    _mm256_store_ps(sums, hsum8(a));
    _mm256_store_ps(sums + 8, hsum8(a + 8));
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      #pragma GCC unroll 16
      for (int h = 0; h < H; ++h) logits[h * kRowsMax + r0 + r] = sums[r * H + h];
    }
  }
  for (; r0 < n; ++r0) {
    __m512 a[H];
    #pragma GCC unroll 16
    for (int h = 0; h < H; ++h) a[h] = _mm512_setzero_ps();
    for (uint32_t j = 0; j < d; j += 16) {
      const __m512 kv = load16<T>(k_rows[r0], j);
      #pragma GCC unroll 16
      for (int h = 0; h < H; ++h) {
        a[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + static_cast<size_t>(h) * d + j), kv, a[h]);
      }
    }
    #pragma GCC unroll 16
    for (int h = 0; h < H; ++h) logits[h * kRowsMax + r0] = _mm512_reduce_add_ps(a[h]);
  }
}

// acc_h += sum_r w[h][r] v_r with H x C accumulators in registers across the rows
// (C vectors of 16 lanes of d per pass); each V vector is widened once for H heads.
template <DType T, int H, int C>
SSA_AVX512 void tile_values(const void* const* v_rows, size_t n, uint32_t d, const float* w, float* acc) {
  for (uint32_t j = 0; j < d; j += 16 * C) {
    __m512 a[H][C];
    #pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      #pragma GCC unroll 16
      for (int c = 0; c < C; ++c) a[h][c] = _mm512_loadu_ps(acc + static_cast<size_t>(h) * d + j + 16 * c);
    }
    for (size_t r = 0; r < n; ++r) {
      __m512 vv[C];
      #pragma GCC unroll 16
      for (int c = 0; c < C; ++c) vv[c] = load16<T>(v_rows[r], j + 16 * c);
      #pragma GCC unroll 16
      for (int h = 0; h < H; ++h) {
        const __m512 wt = _mm512_set1_ps(w[h * kRowsMax + r]);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) a[h][c] = _mm512_fmadd_ps(wt, vv[c], a[h][c]);
      }
    }
    #pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      #pragma GCC unroll 16
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + static_cast<size_t>(h) * d + j + 16 * c, a[h][c]);
    }
  }
}

// tile_values with the widest pass (C <= C0 vectors) that divides d.
template <DType T, int H, int C0>
SSA_AVX512 void tile_values_fit(const void* const* v_rows, size_t n, uint32_t d, const float* w, float* acc) {
  if constexpr (C0 > 1) {
    if (d % (16 * C0) != 0) {
      tile_values_fit<T, H, C0 / 2>(v_rows, n, d, w, acc);
      return;
    }
  }
  tile_values<T, H, C0>(v_rows, n, d, w, acc);
}

template <DType T, int H>
SSA_AVX512 void attend_tile(const void* const* k_rows, const void* const* v_rows, size_t n, uint32_t d,
                            const float* q, const float* offset, float* m, float* l, float* acc) {
  alignas(64) float logits[H * kRowsMax] = {}, w[H * kRowsMax];  // = {}: the compiler cannot see the padding loop
  tile_scores<T, H>(k_rows, n, d, q, logits);
  const size_t nv = (n + 15) / 16 * 16;  // whole vectors; the padding weighs exp(-inf) = 0
  #pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    float* lg = logits + h * kRowsMax;
    for (size_t r = 0; r < n; ++r) lg[r] -= offset != nullptr ? offset[r] : 0.0f;
    for (size_t r = n; r < nv; ++r) lg[r] = -INFINITY;
    __m512 mx = _mm512_load_ps(lg);
    if (nv > 16) mx = _mm512_max_ps(mx, _mm512_load_ps(lg + 16));
    const float bm = _mm512_reduce_max_ps(mx);
    float* a = acc + static_cast<size_t>(h) * d;
    if (bm > m[h]) {
      const float scale = m[h] == -INFINITY ? 0.0f : expf(m[h] - bm);
      const __m512 sv = _mm512_set1_ps(scale);
      for (uint32_t j = 0; j < d; j += 16) _mm512_storeu_ps(a + j, _mm512_mul_ps(sv, _mm512_loadu_ps(a + j)));
      l[h] *= scale;
      m[h] = bm;
    }
    const __m512 mv = _mm512_set1_ps(m[h]);
    __m512 ls = _mm512_setzero_ps();
    for (size_t b = 0; b < nv; b += 16) {
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(lg + b), mv));
      _mm512_store_ps(w + h * kRowsMax + b, e);
      ls = _mm512_add_ps(ls, e);
    }
    l[h] += _mm512_reduce_add_ps(ls);
  }
  tile_values_fit<T, H, kChains / H>(v_rows, n, d, w, acc);
}

template <DType T>
SSA_AVX512 void attend_rows_as(const void* const* k_rows, const void* const* v_rows, size_t n, uint32_t d,
                               const float* q, uint32_t g, const float* offset, float* m, float* l,
                               float* acc) {
  for (uint32_t h0 = 0; h0 < g; h0 += 4) {
    const float* qh = q + size_t{h0} * d;
    float* ah = acc + size_t{h0} * d;
    switch (g - h0 < 4 ? g - h0 : 4) {
      case 1: attend_tile<T, 1>(k_rows, v_rows, n, d, qh, offset, m + h0, l + h0, ah); break;
      case 2: attend_tile<T, 2>(k_rows, v_rows, n, d, qh, offset, m + h0, l + h0, ah); break;
      case 3: attend_tile<T, 3>(k_rows, v_rows, n, d, qh, offset, m + h0, l + h0, ah); break;
      default: attend_tile<T, 4>(k_rows, v_rows, n, d, qh, offset, m + h0, l + h0, ah); break;
    }
  }
}

// Head dims that are not a multiple of 16 (or oversized blocks) take the AVX2 kernel.
void (*avx2_attend_rows)(DType, const void* const*, const void* const*, size_t, uint32_t, const float*,
                         uint32_t, const float*, float*, float*, float*) = nullptr;

SSA_AVX512 void attend_rows(DType t, const void* const* k_rows, const void* const* v_rows, size_t n,
                            uint32_t d, const float* q, uint32_t g, const float* offset, float* m, float* l,
                            float* acc) {
  if (d % 16 != 0 || n > kRowsMax) {
    avx2_attend_rows(t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
    return;
  }
  switch (t) {
    case DType::kF32: attend_rows_as<DType::kF32>(k_rows, v_rows, n, d, q, g, offset, m, l, acc); break;
    case DType::kF16: attend_rows_as<DType::kF16>(k_rows, v_rows, n, d, q, g, offset, m, l, acc); break;
    default: attend_rows_as<DType::kBF16>(k_rows, v_rows, n, d, q, g, offset, m, l, acc); break;
  }
}

}  // namespace

const Kernels* avx512_kernels() {
  static const Kernels* k = []() -> const Kernels* {
    const Kernels* avx2 = avx2_kernels();
    if (avx2 == nullptr || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
      return nullptr;
    }
    static Kernels set = *avx2;
    avx2_attend_rows = avx2->attend_rows;
    set.attend_rows = attend_rows;
    set.name = "avx512";
    return &set;
  }();
  return k;
}

}  // namespace ssa::simd
#else
#include "simd.h"
namespace ssa::simd {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace ssa::simd
#endif
