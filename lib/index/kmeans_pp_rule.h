// The arithmetic of k-means++ seeding that the CPU's k-means (lib/index/kmeans.cc)
// and the GPU's seeding kernel (kernels/kmeans_seed.cu) share, so that both pick
// the same seeds from the same points.
//
// A point's D^2 weight is its squared distance to the nearest seed so far, a
// float summed over the dimensions in order without fused multiply-adds (kmeans.cc
// compiles with -ffp-contract=off), then scaled to an integer: weights are
// summed as integers, exactly, so the running sums that decide a pick are the
// same in any summation order (sequential on the CPU, a block scan on the GPU).
// The scale puts the largest weight after the first seed (weights only shrink
// after it) just below 2^kKmeansPpWeightBits: with at most kKmeansPpMaxPoints
// points the total stays below 2^53, exact in a double. Points nearer a seed than
// 2^-40 of that largest weight weigh 0; they are seeds already, to within rounding.
#pragma once

#include <math.h>
#include <stdint.h>

#include "common/host_device.h"

namespace ssa {

// k-means++ runs on an evenly spread subset of at most this many points: seeding
// all of them, O(n k dim), would otherwise cost more than the Lloyd iterations.
constexpr uint32_t kKmeansPpMaxPoints = 16 * 256;
constexpr int kKmeansPpWeightBits = 40;

// Point i of the seeding subset of n points (all of them when n <= kKmeansPpMaxPoints).
SSA_HD uint64_t kmeans_pp_subset_point(uint64_t i, uint64_t n) {
  return n > kKmeansPpMaxPoints ? i * n / kKmeansPpMaxPoints : i;
}
SSA_HD uint32_t kmeans_pp_subset_size(uint64_t n) {
  return n > kKmeansPpMaxPoints ? kKmeansPpMaxPoints : static_cast<uint32_t>(n);
}

// Squared distance, summed in dimension order, every product and sum rounded.
SSA_HD float kmeans_pp_sq_dist(const float* a, const float* b, uint32_t dim) {
  float s = 0.0f;
  for (uint32_t j = 0; j < dim; ++j) {
#if defined(__CUDA_ARCH__)
    const float d = __fsub_rn(a[j], b[j]);
    s = __fadd_rn(s, __fmul_rn(d, d));
#else
    const float d = a[j] - b[j];
    s += d * d;
#endif
  }
  return s;
}

// The factor (a power of two) that maps the largest weight max_d2 just below
// 2^kKmeansPpWeightBits.
SSA_HD double kmeans_pp_scale(float max_d2) {
  int e = 128;  // an infinite distance: finite weights scale as the largest float's
  if (isfinite(max_d2) && max_d2 > 0.0f) frexp(static_cast<double>(max_d2), &e);  // max_d2 < 2^e
  return ldexp(1.0, kKmeansPpWeightBits - e);
}

SSA_HD uint64_t kmeans_pp_weight(float d2, double scale) {
  const double limit = ldexp(1.0, kKmeansPpWeightBits);
  const double w = static_cast<double>(d2) * scale;  // exact: scale is a power of two
  return w >= limit ? static_cast<uint64_t>(limit) : static_cast<uint64_t>(w);
}

// The pick for the uniform draw u in (0, 1) over weights summing to total > 0:
// the first point whose inclusive running sum exceeds this target (the last
// point if none does).
SSA_HD uint64_t kmeans_pp_target(double u, uint64_t total) {
  return static_cast<uint64_t>(u * static_cast<double>(total));
}

}  // namespace ssa
