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

// The 16-lane ISA of the attend_rows tiles (attend_rows_tiles.inc).
struct Isa {
  using V = __m512;
  static constexpr int kLanes = 16;
  // Independent FMA chains per loop: twice the FMA latency times the two FMA
  // pipes, so the pipes never wait on a chain (32 registers leave room for it).
  static constexpr int kChains = 16;
  template <DType T>
  SSA_AVX512 static V load(const void* p, size_t i) { return load16<T>(p, i); }
  SSA_AVX512 static V zero() { return _mm512_setzero_ps(); }
  SSA_AVX512 static V set1(float x) { return _mm512_set1_ps(x); }
  SSA_AVX512 static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  SSA_AVX512 static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  SSA_AVX512 static V load(const float* p) { return _mm512_load_ps(p); }
  SSA_AVX512 static void store(float* p, V v) { _mm512_store_ps(p, v); }
  SSA_AVX512 static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  SSA_AVX512 static V add(V a, V b) { return _mm512_add_ps(a, b); }
  SSA_AVX512 static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  SSA_AVX512 static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  SSA_AVX512 static V max(V a, V b) { return _mm512_max_ps(a, b); }
  SSA_AVX512 static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  SSA_AVX512 static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  SSA_AVX512 static V exp_nonpositive(V x) { return simd::exp_nonpositive(x); }
  SSA_AVX512 static void chain_sums(const V* a, float* out) {
    _mm256_store_ps(out, hsum8(a));
    _mm256_store_ps(out + 8, hsum8(a + 8));
  }
};

#define SSA_TILE_TARGET SSA_AVX512
#include "attend_rows_tiles.inc"
#undef SSA_TILE_TARGET

// Head dims that are not a multiple of 16 (or oversized blocks) take the AVX2 kernel.
void (*avx2_attend_rows)(DType, const void* const*, const void* const*, size_t, uint32_t, const float*,
                         uint32_t, const float*, float*, float*, float*) = nullptr;

SSA_AVX512 void attend_rows(DType t, const void* const* k_rows, const void* const* v_rows, size_t n,
                            uint32_t d, const float* q, uint32_t g, const float* offset, float* m, float* l,
                            float* acc) {
  if (d % Isa::kLanes != 0 || n > kRowsMax) {
    avx2_attend_rows(t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
    return;
  }
  attend_rows_tiles(t, k_rows, v_rows, n, d, q, g, offset, m, l, acc);
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
