// The GPU's Lloyd iterations (kernels/pq_index.cu) against the CPU's k-means
// (lib/index/kmeans.cc) on points where the two must agree bit for bit: every
// sample sub-vector is one of a few well-separated values, so assignments have
// no near-ties between different values, and every centroid is a mean of equal
// points. With far fewer values than centroids, most clusters are empty in every
// iteration, so the backends agree only if they restart the same clusters at the
// same points.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "support/gpu_layer.h"
#include "index/kmeans.h"
#include "index/kmeans_rng.h"
#include "kernels/pq_index.h"

namespace ssa::gputest {
namespace {

TEST_CASE("gpu k-means: empty clusters restart at the points the CPU's k-means picks") {
  SSA_GPU_TEST_OR_SKIP();
  cuda::PqIndexShape s{};
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.subspaces = 8;
  s.centroids = 256;
  const uint32_t sub = s.head_dim / s.subspaces, n = 3000, iterations = 5, distinct = 40;
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> nd(0.f, 1.f);

  // x[h][i][head_dim]: sub-vector m of point i is one of `distinct` values of (h, m).
  std::vector<float> values(size_t{s.n_kv_heads} * s.subspaces * distinct * sub);
  for (float& v : values) v = nd(rng);
  std::vector<float> x(size_t{s.n_kv_heads} * n * s.head_dim);
  for (uint32_t h = 0; h < s.n_kv_heads; ++h)
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t m = 0; m < s.subspaces; ++m) {
        const uint32_t pick = static_cast<uint32_t>(rng() % distinct);
        const float* v = values.data() + ((size_t{h} * s.subspaces + m) * distinct + pick) * sub;
        std::copy(v, v + sub, x.begin() + (size_t{h} * n + i) * s.head_dim + m * sub);
      }

  // Both start from the same k-means++ seeds; the CPU trains each codebook alone.
  const size_t book = size_t{s.centroids} * sub;
  std::vector<float> seeds(size_t{s.n_kv_heads} * s.subspaces * book), cpu(seeds.size());
  for (uint32_t h = 0; h < s.n_kv_heads; ++h)
    for (uint32_t m = 0; m < s.subspaces; ++m) {
      std::vector<float> pts(size_t{n} * sub);
      for (uint32_t i = 0; i < n; ++i)
        std::copy_n(x.begin() + (size_t{h} * n + i) * s.head_dim + m * sub, sub, pts.begin() + i * sub);
      const size_t at = (size_t{h} * s.subspaces + m) * book;
      const uint64_t seed = codebook_seed(h, m, s.subspaces);
      kmeans_pp_seed(pts.data(), n, sub, s.centroids, seed, seeds.data() + at);
      kmeans_train(pts.data(), n, sub, s.centroids, iterations, seed, cpu.data() + at);
    }

  DevBuf<uint8_t> work(cuda::kmeans_workspace_bytes(s, n));
  CUDA_OK(cudaMemcpy(work.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  DevBuf<float> books(seeds.size());
  books.upload(seeds);
  CUDA_OK(cuda::pq_lloyd(s, n, iterations, work.p, books.p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> gpu = books.download(seeds.size());

  // Restarts happened: some centroid moved from a seed to a different value
  // (a cluster of equal points otherwise keeps its seed).
  size_t moved = 0, differ = 0;
  for (size_t c = 0; c < seeds.size() / sub; ++c) {
    bool m = false, d = false;
    for (uint32_t j = 0; j < sub; ++j) {
      m = m || gpu[c * sub + j] != seeds[c * sub + j];
      d = d || gpu[c * sub + j] != cpu[c * sub + j];
    }
    moved += m;
    differ += d;
  }
  MESSAGE(moved, " of ", seeds.size() / sub, " centroids moved from their seeds");
  CHECK(moved > 0);
  CHECK(differ == 0);
}

}  // namespace
}  // namespace ssa::gputest
