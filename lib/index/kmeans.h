// k-means for one PQ subspace: k-means++ seeding (D^2 sampling) followed by Lloyd
// iterations. Deterministic for a given seed: training the same keys twice gives
// the same codebook, whatever the thread count.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace ssa {

// points: [n][dim] floats; centroids (out): [k][dim]. With n <= k every point is
// its own centroid and the remaining centroids repeat the last point (codes stay
// exact). Returns the mean squared quantisation error after the last iteration.
// weights (null: every point weighs 1; else [n], each finite and >= 1) make
// the loss sum_i w_i |x_i - c(x_i)|^2: seeds are drawn with probability
// ~ w D^2 and each centroid is its points' weighted mean. The GPU's k-means
// (kernels/kmeans_seed.cu, kmeans_lloyd.cu) picks the same seeds bit for bit,
// weighted or not, and sums its centroids in fixed point (the same means to
// their rounding).
double kmeans_train(const float* points, size_t n, uint32_t dim, uint32_t k,
                    uint32_t iterations, uint64_t seed, float* centroids, const float* weights = nullptr);

// The seeding alone (k-means++ on an evenly spread subset of at most 4096
// points), same arguments; kmeans_train starts its Lloyd iterations from it.
void kmeans_pp_seed(const float* points, size_t n, uint32_t dim, uint32_t k, uint64_t seed,
                    float* centroids, const float* weights = nullptr);

// Nearest-centroid search over one codebook, with the centroids transposed and
// their norms precomputed for the vectorised kernel.
class CentroidSearch {
 public:
  CentroidSearch(const float* centroids, uint32_t k, uint32_t dim);
  uint32_t nearest(const float* x) const;

 private:
  uint32_t k_, dim_;
  std::vector<float> cent_t_, norms_;
};

}  // namespace ssa
