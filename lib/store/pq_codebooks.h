// Trained PQ codebooks of one layer: for each KV head, pq_subspaces codebooks of
// pq_centroids centroids, each sub_dim floats. Immutable once built; shared by
// forks and replaced as a whole when the layer is retrained.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

namespace ssa {

struct PqCodebooks {
  uint32_t n_kv_heads = 0, subspaces = 0, centroids = 0, sub_dim = 0;
  std::vector<float> data;  // [n_kv_heads][subspaces][centroids][sub_dim]
  // SSA_PROXY_OPQ: per KV head an orthogonal [d][d] matrix R (row-major, d =
  // subspaces * sub_dim); codes quantise R k, and a query scores as R q, so
  // (R q) . (R k) = q . k. Empty for SSA_PROXY_PQ.
  std::vector<float> rotation;  // [n_kv_heads][d][d] or empty

  uint32_t head_dim() const { return subspaces * sub_dim; }
  bool rotated() const { return !rotation.empty(); }
  const float* rotation_of(uint32_t head) const {
    return rotation.data() + size_t{head} * head_dim() * head_dim();
  }

  const float* centroid(uint32_t head, uint32_t m, uint32_t c) const {
    return data.data() + ((size_t{head} * subspaces + m) * centroids + c) * sub_dim;
  }
  float* mutable_centroid(uint32_t head, uint32_t m, uint32_t c) {
    return data.data() + ((size_t{head} * subspaces + m) * centroids + c) * sub_dim;
  }
};

using CodebooksRef = std::shared_ptr<const PqCodebooks>;

}  // namespace ssa
