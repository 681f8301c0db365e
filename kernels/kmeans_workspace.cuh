// The device workspace of k-means training (kernels/pq_index.cu gathers the
// sample, kernels/kmeans_seed.cu seeds, kernels/kmeans_lloyd.cu iterates): one
// allocation, laid out here only.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "index/kmeans_pp_rule.h"
#include "pq_index.h"

namespace ssa::cuda {

struct KmeansWorkspace {
  float* x;              // the sample: [n_kv][n][head_dim]
  long long* sums;       // fixed-point coordinate sums per centroid: [n_kv][M][K][sub]
  float* seed_points;    // each codebook's k-means++ subset: [n_kv][M][subset][sub]
  uint32_t* counts;      // points per centroid: [n_kv][M][K]
  uint32_t* restarts;    // each codebook's restart draws so far: [n_kv][M]
  uint32_t* max_abs;     // each codebook's largest |weight x coordinate|, as float bits: [n_kv][M]
  float* weights;        // the sample's training weights, when weighted: [n_kv][n]
  long long* mass;       // fixed-point weight sums per centroid, when weighted: [n_kv][M][K]
  uint32_t* max_weight;  // each head's largest weight, as float bits: [n_kv]
  size_t bytes;
};

inline KmeansWorkspace kmeans_workspace(const PqIndexShape& s, uint32_t n, void* base) {
  const size_t books = size_t{s.n_kv_heads} * s.subspaces, sub = s.head_dim / s.subspaces;
  const uintptr_t p = reinterpret_cast<uintptr_t>(base);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const uintptr_t q = p + at;
    at += (bytes + 255) / 256 * 256;
    return reinterpret_cast<void*>(q);
  };
  KmeansWorkspace w;
  w.x = reinterpret_cast<float*>(take(size_t{s.n_kv_heads} * n * s.head_dim * sizeof(float)));
  w.sums = reinterpret_cast<long long*>(take(books * s.centroids * sub * sizeof(long long)));
  w.seed_points = reinterpret_cast<float*>(take(books * kmeans_pp_subset_size(n) * sub * sizeof(float)));
  w.counts = reinterpret_cast<uint32_t*>(take(books * s.centroids * sizeof(uint32_t)));
  w.restarts = reinterpret_cast<uint32_t*>(take(books * sizeof(uint32_t)));
  w.max_abs = reinterpret_cast<uint32_t*>(take(books * sizeof(uint32_t)));
  w.weights = reinterpret_cast<float*>(take(size_t{s.n_kv_heads} * n * sizeof(float)));
  w.mass = reinterpret_cast<long long*>(take(books * s.centroids * sizeof(long long)));
  w.max_weight = reinterpret_cast<uint32_t*>(take(size_t{s.n_kv_heads} * sizeof(uint32_t)));
  w.bytes = at;
  return w;
}

}  // namespace ssa::cuda
