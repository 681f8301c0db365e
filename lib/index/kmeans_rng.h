// The random choices of PQ training that both backends must make alike: each
// codebook's seed, and the point an empty cluster restarts at. The CPU's k-means
// and the GPU's Lloyd kernels draw from these, so the two restart the same
// clusters at the same points.
#pragma once

#include <stdint.h>

#include "common/philox.h"

namespace ssa {

// The seed of the codebook of KV head h, subspace m (of M). Fixed: the same keys
// always give the same codebooks (restores and forks never depend on when
// training happened to run).
SSA_HD uint64_t codebook_seed(uint32_t h, uint32_t m, uint32_t M) {
  return 0x9d2c5680a3b1e4f7ull + uint64_t{h} * M + m;
}

// One codebook's stream: k-means++ seeding draws from counter 0 up, restarts of
// empty clusters from kKmeansRestartDraw0 up (past any seeding's draws).
SSA_HD RngStream kmeans_stream(uint64_t seed) {
  return make_rng_stream(seed, 0x6b6d65616e73ull /* "kmeans" */, 0, 0);
}
constexpr uint32_t kKmeansRestartDraw0 = 1u << 30;

// The point (of n) that the draw-th restart of a codebook's training moves its
// empty cluster to.
SSA_HD uint64_t kmeans_restart_point(const RngStream& s, uint32_t draw, uint64_t n) {
  const double u = rng_uniform(rng_draw(s, kKmeansRestartDraw0 + draw).v[0]);
  return static_cast<uint64_t>(u * static_cast<double>(n)) % n;
}

}  // namespace ssa
