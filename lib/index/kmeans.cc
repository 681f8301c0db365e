#include "kmeans.h"

#include <float.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cpu/simd.h"
#include "kmeans_pp_rule.h"
#include "kmeans_rng.h"

namespace ssa {
namespace {

inline float sq_dist(const float* a, const float* b, uint32_t dim) {
  float s = 0.0f;
  for (uint32_t j = 0; j < dim; ++j) {
    const float d = a[j] - b[j];
    s += d * d;
  }
  return s;
}

// Sequential uniform stream for seeding (deterministic, independent of decode RNG).
struct SeedRng {
  RngStream s;
  uint32_t n = 0;
  double next() { return rng_uniform(rng_draw(s, n++).v[0]); }
};

}  // namespace

CentroidSearch::CentroidSearch(const float* centroids, uint32_t k, uint32_t dim)
    : k_(k), dim_(dim), cent_t_(size_t{k} * dim), norms_(k) {
  for (uint32_t c = 0; c < k; ++c) {
    float n = 0.0f;
    for (uint32_t j = 0; j < dim; ++j) {
      const float v = centroids[size_t{c} * dim + j];
      cent_t_[size_t{j} * k + c] = v;
      n += v * v;
    }
    norms_[c] = n;
  }
}

uint32_t CentroidSearch::nearest(const float* x) const {
  return simd::kernels().nearest_centroid(x, cent_t_.data(), norms_.data(), k_, dim_);
}

void kmeans_pp_seed(const float* points, size_t n, uint32_t dim, uint32_t k, uint64_t seed,
                    float* centroids, const float* weights) {
  if (n == 0) {
    memset(centroids, 0, sizeof(float) * k * dim);
    return;
  }
  if (n <= k) {
    for (uint32_t c = 0; c < k; ++c) {
      const size_t src = c < n ? c : n - 1;
      memcpy(centroids + size_t{c} * dim, points + src * dim, sizeof(float) * dim);
    }
    return;
  }
  SeedRng rng{kmeans_stream(seed)};

  // k-means++ (first centroid uniform, each next with probability ~ D(x)^2, in
  // the integer weights of kmeans_pp_rule.h) on an evenly spread subset.
  std::vector<float> subset, subset_weights;
  if (n > kKmeansPpMaxPoints) {
    subset.resize(size_t{kKmeansPpMaxPoints} * dim);
    if (weights != nullptr) subset_weights.resize(kKmeansPpMaxPoints);
    for (size_t i = 0; i < kKmeansPpMaxPoints; ++i) {
      const uint64_t src = kmeans_pp_subset_point(i, n);
      memcpy(&subset[i * dim], points + src * dim, sizeof(float) * dim);
      if (weights != nullptr) subset_weights[i] = weights[src];
    }
    points = subset.data();
    if (weights != nullptr) weights = subset_weights.data();
    n = kKmeansPpMaxPoints;
  }
  // A point's draw weight: D^2, times its weight if it has one (a float
  // product, so the integer rule's bounds hold for it as for D^2).
  auto draw = [weights](float dist2, size_t i) { return weights != nullptr ? dist2 * weights[i] : dist2; };
  std::vector<float> d2(n);
  size_t first = static_cast<size_t>(rng.next() * static_cast<double>(n));
  if (first >= n) first = n - 1;
  memcpy(centroids, points + first * dim, sizeof(float) * dim);
  float max_d2 = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    d2[i] = kmeans_pp_sq_dist(points + i * dim, centroids, dim);
    max_d2 = std::max(max_d2, draw(d2[i], i));
  }
  const double scale = kmeans_pp_scale(max_d2);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += kmeans_pp_weight(draw(d2[i], i), scale);
  for (uint32_t c = 1; c < k; ++c) {
    size_t pick = n - 1;
    const double u = rng.next();
    if (total > 0) {
      const uint64_t target = kmeans_pp_target(u, total);
      uint64_t run = 0;
      for (size_t i = 0; i < n; ++i) {
        run += kmeans_pp_weight(draw(d2[i], i), scale);
        if (run > target) {
          pick = i;
          break;
        }
      }
    } else {
      pick = static_cast<size_t>(u * static_cast<double>(n)) % n;
    }
    float* cen = centroids + size_t{c} * dim;
    memcpy(cen, points + pick * dim, sizeof(float) * dim);
    total = 0;
    for (size_t i = 0; i < n; ++i) {
      const float d = kmeans_pp_sq_dist(points + i * dim, cen, dim);
      if (d < d2[i]) d2[i] = d;
      total += kmeans_pp_weight(draw(d2[i], i), scale);
    }
  }
}

double kmeans_train(const float* points, size_t n, uint32_t dim, uint32_t k,
                    uint32_t iterations, uint64_t seed, float* centroids, const float* weights) {
  kmeans_pp_seed(points, n, dim, k, seed, centroids, weights);
  if (n <= k) return 0.0;
  const RngStream restarts = kmeans_stream(seed);
  uint32_t n_restarts = 0;

  // Lloyd iterations over all points.
  std::vector<uint32_t> assign(n);
  std::vector<double> sums(size_t{k} * dim);
  std::vector<uint32_t> counts(k);
  std::vector<double> mass(weights != nullptr ? k : 0);  // the clusters' summed weights
  double mse = 0.0;
  for (uint32_t it = 0; it <= iterations; ++it) {
    mse = 0.0;
    const CentroidSearch search(centroids, k, dim);
    for (size_t i = 0; i < n; ++i) {
      const float* x = points + i * dim;
      assign[i] = search.nearest(x);
      mse += sq_dist(x, centroids + size_t{assign[i]} * dim, dim);
    }
    mse /= static_cast<double>(n);
    if (it == iterations) break;
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0u);
    std::fill(mass.begin(), mass.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      double* s = sums.data() + size_t{assign[i]} * dim;
      const float* x = points + i * dim;
      if (weights != nullptr) {
        const double w = weights[i];
        for (uint32_t j = 0; j < dim; ++j) s[j] += w * x[j];
        mass[assign[i]] += w;
      } else {
        for (uint32_t j = 0; j < dim; ++j) s[j] += x[j];
      }
      ++counts[assign[i]];
    }
    for (uint32_t c = 0; c < k; ++c) {
      float* cen = centroids + size_t{c} * dim;
      if (counts[c] == 0) {
        // Empty cluster: restart it at a random point so no code is wasted (the
        // GPU's Lloyd kernels pick the same points).
        const uint64_t pick = kmeans_restart_point(restarts, n_restarts++, n);
        memcpy(cen, points + pick * dim, sizeof(float) * dim);
        continue;
      }
      const double inv = 1.0 / (weights != nullptr ? mass[c] : counts[c]);
      for (uint32_t j = 0; j < dim; ++j) cen[j] = static_cast<float>(sums[size_t{c} * dim + j] * inv);
    }
  }
  return mse;
}

}  // namespace ssa
