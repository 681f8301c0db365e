// Trained PQ codebooks of one layer: for each KV head, pq_subspaces codebooks of
// pq_centroids centroids, each sub_dim floats. Immutable once built; shared by
// forks and replaced as a whole when the layer is retrained.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "query_moments.h"

namespace ssa {

struct PqCodebooks {
  uint32_t n_kv_heads = 0, subspaces = 0, centroids = 0, sub_dim = 0;
  std::vector<float> data;  // [n_kv_heads][subspaces][centroids][sub_dim]
  // The key transform T, per KV head a [d][d] matrix (row-major, d = subspaces
  // * sub_dim): codes quantise T k. SSA_PROXY_OPQ, _OPQ4: an orthogonal
  // rotation R, and a query scores as R q, so (R q) . (R k) = q . k.
  // SSA_PROXY_QPQ, _QPQ4: an invertible T, and a query scores as Q q with the
  // query transform Q = T^-T below. Empty for the untransformed proxies.
  std::vector<float> rotation;  // [n_kv_heads][d][d] or empty
  std::vector<float> query_transform;  // QPQ: [n_kv_heads][d][d] with T^T Q = I; else empty
  // QPQ: the observed queries the transforms were learned from (saved with the
  // codebooks, so a loaded session retrains from them); null otherwise or if none.
  QueryMomentsRef trained_moments;

  uint32_t head_dim() const { return subspaces * sub_dim; }
  bool rotated() const { return !rotation.empty(); }
  const float* rotation_of(uint32_t head) const {
    return rotation.data() + size_t{head} * head_dim() * head_dim();
  }
  // What a query is multiplied by before its table is built: Q for QPQ, R for OPQ.
  const float* query_transform_of(uint32_t head) const {
    const std::vector<float>& m = query_transform.empty() ? rotation : query_transform;
    return m.data() + size_t{head} * head_dim() * head_dim();
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
