// Float64 reference of product quantisation's encoding, for tests of the
// proxies' codes.
#pragma once

#include <stdint.h>

#include <vector>

#include "store/pq_codebooks.h"

namespace ssa_test {

// Whether `code` is a nearest centroid of head h's subspace m to the (rotated or
// transformed) key z, within rounding: no centroid is closer by more than a
// relative 1e-4 plus 1e-6, plus what float32 costs the CPU's search, which
// ranks by |c|^2 - 2 z.c (kmeans.h, CentroidSearch): a few units in the last
// place of |z|^2 + |c|^2, which for a key that lies close to two centroids (as
// the weighted training of the query-aware proxies makes them) is more than the
// relative margin of their small distances.
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
  auto norm2 = [&](const double* x) {
    double s2 = 0.0;
    for (uint32_t j = 0; j < sub; ++j) s2 += x[j] * x[j];
    return s2;
  };
  double best = dist(0);
  for (uint32_t c = 1; c < K; ++c) best = best < dist(c) ? best : dist(c);
  std::vector<double> c_code(cb.centroid(h, m, code), cb.centroid(h, m, code) + sub);
  constexpr double kFloat32Ulps = 8 * 5.96e-8;  // 8 units in the last place of a float32
  const double expanded_form = kFloat32Ulps * (norm2(z + m * sub) + norm2(c_code.data()));
  return !(dist(code) > best * (1 + 1e-4) + 1e-6 + expanded_form);
}

}  // namespace ssa_test
