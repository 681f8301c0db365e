// Float64 reference of product quantisation's encoding, for tests of the
// proxies' codes.
#pragma once

#include <stdint.h>

#include "store/pq_codebooks.h"

namespace ssa_test {

// Whether `code` is a nearest centroid of head h's subspace m to the (rotated or
// transformed) key z, within rounding: no centroid is closer by more than a
// relative 1e-4 plus 1e-6.
inline bool is_nearest_centroid(const ssa::PqCodebooks& cb, uint32_t h, uint32_t m, const double* z, uint32_t code) {
  const uint32_t sub = cb.sub_dim, K = cb.centroids;
  auto dist = [&](uint32_t c) {
    double s2 = 0.0;
    for (uint32_t j = 0; j < sub; ++j) {
      const double e = z[m * sub + j] - cb.centroid(h, m, c)[j];
      s2 += e * e;
    }
    return s2;
  };
  double best = dist(0);
  for (uint32_t c = 1; c < K; ++c) best = best < dist(c) ? best : dist(c);
  return !(dist(code) > best * (1 + 1e-4) + 1e-6);
}

}  // namespace ssa_test
