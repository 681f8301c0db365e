// The GPU's k-means (kernels/kmeans_seed.cu, kernels/kmeans_lloyd.cu) against
// the CPU's (lib/index/kmeans.cc): the seeds bit for bit, the trained codebooks'
// quantisation error, and the runs' determinism, unweighted and with the
// query-aware proxies' key weights. First, the Lloyd iterations on
// points where the two must agree bit for bit: every sample sub-vector is one of
// a few well-separated values, so assignments have no near-ties between
// different values, and every centroid is a mean of equal points. With far fewer values than centroids, most clusters are empty in every
// iteration, so the backends agree only if they restart the same clusters at the
// same points.
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
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
  CUDA_OK(cuda::pq_lloyd(s, n, iterations, false, work.p, books.p, nullptr));
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

namespace ssa::gputest {
namespace {

// Sample points x[h][n][head_dim] in the shape of attention keys: a per-head
// offset, an outlier coordinate, clusters of different spreads, and some exact
// duplicates (points that weigh nothing once one of them is a seed).
std::vector<float> key_like_points(const cuda::PqIndexShape& s, uint32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.2f, 2.f);
  const uint32_t d = s.head_dim, clusters = 60;
  std::vector<float> x(size_t{s.n_kv_heads} * n * d);
  for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
    std::vector<float> centres(size_t{clusters} * d), spread(clusters), offset(d);
    for (float& v : offset) v = 0.5f * nd(rng);
    for (float& v : centres) v = 2.f * nd(rng);
    for (float& v : spread) v = ud(rng);
    for (uint32_t i = 0; i < n; ++i) {
      float* p = x.data() + (size_t{h} * n + i) * d;
      if (i > 0 && rng() % 16 == 0) {  // a duplicate of an earlier point
        std::copy_n(x.data() + (size_t{h} * n + rng() % i) * d, d, p);
        continue;
      }
      const uint32_t c = static_cast<uint32_t>(rng() % clusters);
      for (uint32_t j = 0; j < d; ++j) p[j] = offset[j] + centres[size_t{c} * d + j] + spread[c] * nd(rng);
      p[3] *= 20.f;  // an outlier coordinate, as some key channels are
    }
  }
  return x;
}

// Codebook (h, m)'s points as the CPU's k-means takes them: [n][sub].
std::vector<float> codebook_points(const cuda::PqIndexShape& s, const std::vector<float>& x, uint32_t n,
                                   uint32_t h, uint32_t m) {
  const uint32_t sub = s.head_dim / s.subspaces;
  std::vector<float> pts(size_t{n} * sub);
  for (uint32_t i = 0; i < n; ++i)
    std::copy_n(x.begin() + (size_t{h} * n + i) * s.head_dim + m * sub, sub, pts.begin() + size_t{i} * sub);
  return pts;
}

// Mean squared distance of the points to their nearest centroid (float64),
// weighted by w ([n]) when it is not null.
double quantisation_mse(const std::vector<float>& pts, uint32_t sub, const float* book, uint32_t K,
                        const float* w = nullptr) {
  const size_t n = pts.size() / sub;
  double total = 0.0, mass = 0.0;
  for (size_t i = 0; i < n; ++i) {
    double best = INFINITY;
    for (uint32_t c = 0; c < K; ++c) {
      double d2 = 0.0;
      for (uint32_t j = 0; j < sub; ++j) {
        const double df = double(pts[i * sub + j]) - book[size_t{c} * sub + j];
        d2 += df * df;
      }
      best = std::min(best, d2);
    }
    const double wi = w != nullptr ? w[i] : 1.0;
    total += wi * best;
    mass += wi;
  }
  return total / mass;
}

cuda::PqIndexShape kmeans_shape(uint32_t n_kv, uint32_t head_dim, uint32_t subspaces, uint32_t centroids) {
  cuda::PqIndexShape s{};
  s.n_kv_heads = n_kv;
  s.head_dim = head_dim;
  s.subspaces = subspaces;
  s.centroids = centroids;
  return s;
}

// Training weights [h][n] in the shape of the query-aware proxies' key weights
// (lib/index/key_weights.h): most keys 1, a few a large multiple of a share.
std::vector<float> key_like_weights(const cuda::PqIndexShape& s, uint32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> w(size_t{s.n_kv_heads} * n, 1.0f);
  for (float& v : w)
    if (rng() % 8 == 0) v = 1.0f + 256.0f * static_cast<float>(1 + rng() % 64) / 64.0f;
  return w;
}

// Seeds (and, with iterations > 0, trained codebooks) of the device's k-means
// from the sample x, weighted by `weights` ([h][n]) unless it is empty; from
// the given starting codebooks instead of k-means++ seeds unless `start` is empty.
std::vector<float> device_codebooks(const cuda::PqIndexShape& s, const std::vector<float>& x, uint32_t n,
                                    uint32_t iterations, const std::vector<float>& weights = {},
                                    const std::vector<float>& start = {}) {
  DevBuf<uint8_t> work(cuda::kmeans_workspace_bytes(s, n));
  CUDA_OK(cudaMemcpy(work.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  const bool weighted = !weights.empty();
  if (weighted) {
    CUDA_OK(cudaMemcpy(cuda::kmeans_sample_weights(s, n, work.p), weights.data(), weights.size() * sizeof(float),
                       cudaMemcpyHostToDevice));
  }
  const size_t count = size_t{s.n_kv_heads} * s.subspaces * s.centroids * (s.head_dim / s.subspaces);
  DevBuf<float> books(count);
  if (start.empty()) {
    CUDA_OK(cudaMemset(books.p, 0xff, count * sizeof(float)));  // NaN: every entry must be written
    CUDA_OK(cuda::pq_seed(s, n, weighted, work.p, books.p, nullptr));
  } else {
    books.upload(start);
  }
  CUDA_OK(cuda::pq_lloyd(s, n, iterations, weighted, work.p, books.p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  return books.download(count);
}

// The device's k-means++ picks the CPU's seeds, bit for bit: over a subset of
// the sample (n above 4096), over all of it, and with no more points than
// centroids; sub-vectors of 4, 8 and 16 floats; 256 and 64 centroids.
TEST_CASE("gpu k-means: k-means++ seeds on the device are the CPU's") {
  SSA_GPU_TEST_OR_SKIP();
  struct Case {
    cuda::PqIndexShape s;
    uint32_t n;
  };
  const Case cases[] = {{kmeans_shape(2, 128, 16, 256), 16384}, {kmeans_shape(2, 64, 16, 256), 3001},
                        {kmeans_shape(1, 64, 4, 64), 5000},     {kmeans_shape(2, 64, 8, 256), 200},
                        {kmeans_shape(1, 64, 8, 256), 256}};
  for (const Case& cs : cases) {
    const cuda::PqIndexShape& s = cs.s;
    const uint32_t sub = s.head_dim / s.subspaces, n = cs.n;
    CAPTURE(n);
    CAPTURE(sub);
    const std::vector<float> x = key_like_points(s, n, 7 + n);
    const std::vector<float> w = key_like_weights(s, n, 11 + n);
    for (const bool weighted : {false, true}) {
      CAPTURE(weighted);
      const std::vector<float> gpu = device_codebooks(s, x, n, 0, weighted ? w : std::vector<float>{});
      const size_t book = size_t{s.centroids} * sub;
      size_t differ = 0, differ_unweighted = 0;
      for (uint32_t h = 0; h < s.n_kv_heads; ++h)
        for (uint32_t m = 0; m < s.subspaces; ++m) {
          const std::vector<float> pts = codebook_points(s, x, n, h, m);
          std::vector<float> cpu(book), plain(book);
          const uint64_t seed = codebook_seed(h, m, s.subspaces);
          kmeans_pp_seed(pts.data(), n, sub, s.centroids, seed, cpu.data(),
                         weighted ? w.data() + size_t{h} * n : nullptr);
          kmeans_pp_seed(pts.data(), n, sub, s.centroids, seed, plain.data());
          const float* g = gpu.data() + (size_t{h} * s.subspaces + m) * book;
          for (size_t e = 0; e < book; ++e) {
            differ += !(g[e] == cpu[e]);
            differ_unweighted += !(g[e] == plain[e]);
          }
        }
      CHECK(differ == 0);
      // The weights changed the draws (where there is a draw: more points than centroids).
      if (weighted && n > s.centroids) CHECK(differ_unweighted > 0);
    }
  }
}

// One weighted Lloyd step on the device from given centroids: every centroid
// with points becomes their weighted mean, against a float64 reference that
// assigns each point to its nearest centroid (codebooks where some point is
// near a tie are left out: float32 may assign it either way).
TEST_CASE("gpu k-means: a weighted Lloyd step moves each centroid to its points' weighted mean") {
  SSA_GPU_TEST_OR_SKIP();
  const cuda::PqIndexShape s = kmeans_shape(2, 64, 8, 64);
  const uint32_t sub = s.head_dim / s.subspaces, n = 6000, K = s.centroids;
  const std::vector<float> x = key_like_points(s, n, 31);
  const std::vector<float> w = key_like_weights(s, n, 32);
  // Start from every 90th point, so that no centroid starts empty by design.
  std::vector<float> start(size_t{s.n_kv_heads} * s.subspaces * K * sub);
  for (uint32_t h = 0; h < s.n_kv_heads; ++h)
    for (uint32_t m = 0; m < s.subspaces; ++m)
      for (uint32_t c = 0; c < K; ++c)
        for (uint32_t j = 0; j < sub; ++j)
          start[((size_t{h} * s.subspaces + m) * K + c) * sub + j] =
              x[(size_t{h} * n + c * 90) * s.head_dim + m * sub + j];
  const std::vector<float> gpu = device_codebooks(s, x, n, 1, w, start);
  size_t checked = 0, skipped_books = 0;
  double worst = 0.0;
  for (uint32_t h = 0; h < s.n_kv_heads; ++h)
    for (uint32_t m = 0; m < s.subspaces; ++m) {
      const std::vector<float> pts = codebook_points(s, x, n, h, m);
      const float* c0 = start.data() + (size_t{h} * s.subspaces + m) * K * sub;
      std::vector<double> sum(size_t{K} * sub, 0.0), mass(K, 0.0);
      bool near_tie = false;
      for (uint32_t i = 0; i < n; ++i) {
        double best = INFINITY, second = INFINITY;
        uint32_t bc = 0;
        for (uint32_t c = 0; c < K; ++c) {
          double d2 = 0.0;
          for (uint32_t j = 0; j < sub; ++j) {
            const double df = double(pts[size_t{i} * sub + j]) - c0[size_t{c} * sub + j];
            d2 += df * df;
          }
          if (d2 < best) {
            second = best;
            best = d2;
            bc = c;
          } else if (d2 < second) {
            second = d2;
          }
        }
        // Equal start points (duplicates) tie exactly; both sides then pick the
        // lowest index. Float32's |c|^2 - 2 x.c errs by a few ulps of |x|^2 + |c|^2.
        double x2 = 0.0;
        for (uint32_t j = 0; j < sub; ++j) x2 += double(pts[size_t{i} * sub + j]) * pts[size_t{i} * sub + j];
        if (second != best && second - best < 1e-5 * (1.0 + x2 + best)) near_tie = true;
        const double wi = w[size_t{h} * n + i];
        for (uint32_t j = 0; j < sub; ++j) sum[size_t{bc} * sub + j] += wi * pts[size_t{i} * sub + j];
        mass[bc] += wi;
      }
      if (near_tie) {
        ++skipped_books;
        continue;
      }
      const float* g = gpu.data() + (size_t{h} * s.subspaces + m) * K * sub;
      for (uint32_t c = 0; c < K; ++c) {
        if (mass[c] == 0.0) continue;  // restarted at a sample point (the CPU's pick; tested above)
        for (uint32_t j = 0; j < sub; ++j) {
          const double ref = sum[size_t{c} * sub + j] / mass[c];
          worst = std::max(worst, std::fabs(g[size_t{c} * sub + j] - ref) / (1.0 + std::fabs(ref)));
        }
        ++checked;
      }
    }
  MESSAGE(checked, " centroids checked, ", skipped_books, " codebooks with near-ties left out; worst error ", worst);
  CHECK(checked >= size_t{K} * s.n_kv_heads * s.subspaces / 2);
  CHECK(worst < 1e-6);
}

// A training shape: the codebooks, the sample's size and the Lloyd iterations.
struct TrainingCase {
  cuda::PqIndexShape s;
  uint32_t n, iterations;
};

// The device's training (k-means++ seeds, then Lloyd iterations with
// fixed-point sums) gives the same codebooks on every run, and codebooks as good
// as the CPU's k-means on the same points: the mean squared quantisation error
// (float64, over every point) within 2% of the CPU's, codebook by codebook
// summed per shape.
TEST_CASE("gpu k-means: device training is deterministic and quantises as well as the CPU's") {
  SSA_GPU_TEST_OR_SKIP();
  const TrainingCase cases[] = {{kmeans_shape(1, 128, 16, 256), 16384, 8}, {kmeans_shape(1, 64, 4, 64), 5000, 6},
                        {kmeans_shape(1, 32, 16, 256), 3000, 8}};
  for (const TrainingCase& cs : cases) {
    const cuda::PqIndexShape& s = cs.s;
    const uint32_t sub = s.head_dim / s.subspaces, n = cs.n;
    CAPTURE(n);
    CAPTURE(sub);
    const std::vector<float> x = key_like_points(s, n, 99 + n);
    const std::vector<float> gpu = device_codebooks(s, x, n, cs.iterations);
    CHECK(device_codebooks(s, x, n, cs.iterations) == gpu);
    const size_t book = size_t{s.centroids} * sub;
    double mse_gpu = 0.0, mse_cpu = 0.0, mse_seed = 0.0;
    for (uint32_t h = 0; h < s.n_kv_heads; ++h)
      for (uint32_t m = 0; m < s.subspaces; ++m) {
        const std::vector<float> pts = codebook_points(s, x, n, h, m);
        const uint64_t seed = codebook_seed(h, m, s.subspaces);
        std::vector<float> cpu(book), seeds(book);
        kmeans_train(pts.data(), n, sub, s.centroids, cs.iterations, seed, cpu.data());
        kmeans_pp_seed(pts.data(), n, sub, s.centroids, seed, seeds.data());
        mse_cpu += quantisation_mse(pts, sub, cpu.data(), s.centroids);
        mse_seed += quantisation_mse(pts, sub, seeds.data(), s.centroids);
        mse_gpu += quantisation_mse(pts, sub, gpu.data() + (size_t{h} * s.subspaces + m) * book, s.centroids);
      }
    MESSAGE("quantisation MSE: seeds ", mse_seed, ", CPU k-means ", mse_cpu, ", GPU k-means ", mse_gpu);
    CHECK(mse_cpu < 0.97 * mse_seed);  // the iterations did something
    CHECK(mse_gpu <= 1.02 * mse_cpu);
  }
}

// The same with the query-aware proxies' key weights: deterministic, and the
// weighted quantisation error within 2% of the CPU's weighted k-means on the
// same points and weights, below the unweighted training's (which spends its
// centroids without regard to the weights).
TEST_CASE("gpu k-means: weighted device training is deterministic and quantises as the CPU's weighted k-means") {
  SSA_GPU_TEST_OR_SKIP();
  const TrainingCase cases[] = {{kmeans_shape(1, 128, 16, 256), 16384, 8}, {kmeans_shape(1, 128, 32, 16), 16384, 8},
                        {kmeans_shape(1, 64, 4, 64), 5000, 6}};
  for (const TrainingCase& cs : cases) {
    const cuda::PqIndexShape& s = cs.s;
    const uint32_t sub = s.head_dim / s.subspaces, n = cs.n;
    CAPTURE(n);
    CAPTURE(sub);
    const std::vector<float> x = key_like_points(s, n, 199 + n);
    const std::vector<float> w = key_like_weights(s, n, 201 + n);
    const std::vector<float> gpu = device_codebooks(s, x, n, cs.iterations, w);
    CHECK(device_codebooks(s, x, n, cs.iterations, w) == gpu);
    const std::vector<float> plain = device_codebooks(s, x, n, cs.iterations);
    const size_t book = size_t{s.centroids} * sub;
    double mse_gpu = 0.0, mse_cpu = 0.0, mse_plain = 0.0;
    for (uint32_t h = 0; h < s.n_kv_heads; ++h)
      for (uint32_t m = 0; m < s.subspaces; ++m) {
        const std::vector<float> pts = codebook_points(s, x, n, h, m);
        const float* wh = w.data() + size_t{h} * n;
        std::vector<float> cpu(book);
        kmeans_train(pts.data(), n, sub, s.centroids, cs.iterations, codebook_seed(h, m, s.subspaces), cpu.data(), wh);
        const size_t at = (size_t{h} * s.subspaces + m) * book;
        mse_cpu += quantisation_mse(pts, sub, cpu.data(), s.centroids, wh);
        mse_gpu += quantisation_mse(pts, sub, gpu.data() + at, s.centroids, wh);
        mse_plain += quantisation_mse(pts, sub, plain.data() + at, s.centroids, wh);
      }
    MESSAGE("weighted quantisation MSE: CPU weighted k-means ", mse_cpu, ", GPU weighted ", mse_gpu,
            ", GPU unweighted ", mse_plain);
    CHECK(mse_gpu <= 1.02 * mse_cpu);
    CHECK(mse_gpu < mse_plain);
  }
}

}  // namespace
}  // namespace ssa::gputest
