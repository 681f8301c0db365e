// A residual weight w in [0, 1] as the exact integer round(w * 2^38): the unit of
// every sampler sum (select/fixed_point_sampler.h says why), shared with the
// SIMD kernels that sum a block of weights at once.
#pragma once

#include <stdint.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace ssa {

constexpr float kFixedWeightOne = 274877906944.0f;  // 2^38

// round(w * 2^38) for w in [0, 1] (w * 2^38 is exact in float), to nearest even as
// nearbyintf in the default rounding mode. On x86-64 by one cvtss2si: baseline
// x86-64 has no roundss, so nearbyintf is a libm call per weight, and the
// sampler's sums take one per candidate (equal for every w in [0, 1]: checked
// over all of them).
inline uint64_t fixed_weight(float w) {
#if defined(__x86_64__)
  return static_cast<uint64_t>(_mm_cvtss_si64(_mm_set_ss(w * kFixedWeightOne)));
#else
  return static_cast<uint64_t>(__builtin_nearbyintf(w * kFixedWeightOne));
#endif
}

}  // namespace ssa
