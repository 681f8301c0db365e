// The query-aware proxies' training steps per key on the GPU
// (kernels/query_aware_train.cu) against the host functions a CPU session
// trains with (lib/index/query_transform.h, rotation.h, key_weights.h), bit for
// bit: the whitened keys, the upper triangle of their second moments, and the
// keys' weights, for head dims 64, 128 and 256, a sample that is no multiple of
// the blocks, heads with all, some and none of the recent queries, and keys
// repeated so that scores tie at the thresholds.
#include <doctest/doctest.h>
#include <string.h>

#include <random>
#include <vector>

#include "index/key_weights.h"
#include "index/query_transform.h"
#include "index/rotation.h"
#include "kernels/query_aware_train.h"
#include "store/query_moments.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

struct QaCase {
  uint32_t d, n;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("gpu query-aware training: whitened keys, second moments and key weights are the host's bits") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t H = 3, n_q = 6;
  for (const QaCase& qc : {QaCase{64, 3001}, QaCase{128, 5000}, QaCase{256, 1500}}) {
    const uint32_t d = qc.d, n = qc.n;
    CAPTURE(d);
    cuda::PqIndexShape shape{};
    shape.n_kv_heads = H;
    shape.head_dim = d;
    shape.subspaces = 16;
    shape.centroids = 256;
    std::mt19937_64 rng(900 + d);
    std::normal_distribution<float> nd;
    // Keys with uneven scales per dimension; every 13th repeats an earlier one.
    std::vector<float> x(size_t{H} * n * d);
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t i = 0; i < n; ++i) {
        float* p = x.data() + (size_t{h} * n + i) * d;
        if (i > 0 && i % 13 == 0) {
          memcpy(p, x.data() + (size_t{h} * n + rng() % i) * d, d * sizeof(float));
          continue;
        }
        for (uint32_t j = 0; j < d; ++j) p[j] = nd(rng) * (0.5f + static_cast<float>(j % 9));
      }
    // 300 steps of 6 query heads: each KV head keeps its last 256 queries; head 1
    // then keeps 100 and head 2 none (as a layer whose counts differ by head).
    std::vector<float> q(size_t{300} * n_q * d);
    for (float& v : q) v = nd(rng);
    auto moments = add_query_moments(nullptr, H, n_q, d, q.data(), 300);
    moments->recent_count[1] = 100;
    moments->recent_count[2] = 0;

    // Host: each head's whitening, whitened keys, second moments and weights.
    std::vector<double> a_t(size_t{H} * d * d), c_host(size_t{H} * d * d, 0.0);
    std::vector<float> y_host(x.size()), w_host(size_t{H} * n, 1.0f);
    for (uint32_t h = 0; h < H; ++h) {
      const QueryWhitening w = query_whitening(moments->sum_of(h), moments->count[h], d);
      std::copy(w.a_t.begin(), w.a_t.end(), a_t.begin() + size_t{h} * d * d);
      whiten_keys(w, x.data() + size_t{h} * n * d, 0, n, d, y_host.data() + size_t{h} * n * d);
      second_moment_rows(y_host.data() + size_t{h} * n * d, n, d, 0, d, c_host.data() + size_t{h} * d * d);
      if (moments->recent_count[h] > 0)
        heavy_key_weights(x.data() + size_t{h} * n * d, n, d, moments->recent_of(h),
                          static_cast<uint32_t>(moments->recent_count[h]), w_host.data() + size_t{h} * n);
    }

    DevBuf<float> x_dev(x.size()), y_dev(x.size()), q_dev(moments->recent.size()), w_dev(size_t{H} * n);
    DevBuf<double> a_dev(a_t.size()), c_dev(c_host.size());
    DevBuf<uint32_t> counts_dev(H);
    DevBuf<uint8_t> scratch(cuda::qa_key_weights_scratch_bytes(shape, n, kRecentQueries));
    x_dev.upload(x);
    a_dev.upload(a_t);
    q_dev.upload(moments->recent);
    counts_dev.upload({static_cast<uint32_t>(moments->recent_count[0]), static_cast<uint32_t>(moments->recent_count[1]),
                       0u});
    CUDA_OK(cudaMemset(c_dev.p, 0, c_host.size() * sizeof(double)));  // the lower triangle stays 0, as on the host
    CUDA_OK(cudaMemset(w_dev.p, 0xff, size_t{H} * n * sizeof(float)));  // NaN: every weight must be written
    CUDA_OK(cuda::qa_whiten_keys(shape, n, a_dev.p, x_dev.p, y_dev.p, nullptr));
    CUDA_OK(cuda::qa_second_moments(shape, n, y_dev.p, c_dev.p, nullptr));
    CUDA_OK(cuda::qa_key_weights(shape, n, x_dev.p, q_dev.p, kRecentQueries, counts_dev.p, scratch.p, w_dev.p,
                                 nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(same_bits(y_dev.download(x.size()), y_host));
    const std::vector<double> c_gpu = c_dev.download(c_host.size());
    CHECK(memcmp(c_gpu.data(), c_host.data(), c_host.size() * sizeof(double)) == 0);
    const std::vector<float> w_gpu = w_dev.download(size_t{H} * n);
    CHECK(same_bits(w_gpu, w_host));
    // The weights are not trivial: heads with queries hold keys above 1, head 2 none.
    size_t heavy[H] = {0, 0, 0};
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t i = 0; i < n; ++i) heavy[h] += w_host[size_t{h} * n + i] > 1.0f;
    CHECK(heavy[0] > 0);
    CHECK(heavy[1] > 0);
    CHECK(heavy[2] == 0);
  }
}

}  // namespace
}  // namespace ssa::gputest
