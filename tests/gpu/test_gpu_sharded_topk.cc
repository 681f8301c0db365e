// The CUDA global top-k over shards (lib/cuda/device_sharded_topk.h) against the
// top-k of all candidates in one place (topk_indices, radix_topk.h) and against
// the CPU's sharded top-k (lib/shard/sharded_topk.h) shard by shard: 1-4 ranks
// as threads of this process, each with its scores in device memory of device
// 0, exchanging through the in-process collectives (host-staged) and through the
// peer collectives (lib/cuda/peer_collective.h: device buffers read in place,
// checked on their own below, against the host ones). Scores with
// many ties (the tie rule decides), +-0, -inf, empty shards, uneven cuts, and
// every kind of k (0, 1, within one tie run, n - 1, all, more than all).
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cpu/thread_pool.h"
#include "cuda/device_sharded_topk.h"
#include "cuda/peer_collective.h"
#include "select/radix_topk.h"
#include "shard/in_process_collective.h"
#include "shard/sharded_topk.h"
#include "status.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

// Rows of n scores: few distinct values (long tie runs), some +-0 and -inf.
std::vector<std::vector<float>> make_rows(uint32_t rows, uint32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> x(rows, std::vector<float>(n));
  for (uint32_t r = 0; r < rows; ++r) {
    const uint32_t distinct = r % 2 == 0 ? 50 : 100000;
    for (auto& v : x[r]) {
      const uint64_t c = rng() % 100;
      if (c == 0) {
        v = -INFINITY;
      } else if (c == 1) {
        v = -0.0f;
      } else if (c == 2) {
        v = 0.0f;
      } else {
        v = (static_cast<float>(rng() % distinct) - distinct / 3.0f) * 0.125f;
      }
    }
  }
  return x;
}

// Device memory of one rank (its thread may not REQUIRE: errors are returned).
struct RankBuf {
  void* p = nullptr;
  ~RankBuf() { cudaFree(p); }
};

#define RANK_CUDA(expr)                                                          \
  do {                                                                           \
    const cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) return make_error(SSA_ERR_DEVICE, cudaGetErrorString(e_)); \
  } while (0)

// What rank `rank` of the device run marked, as global candidate indices per row.
absl::Status device_rank(Collective& host, bool peer, const std::vector<std::vector<float>>& x,
                         const std::vector<uint32_t>& cut, const std::vector<uint64_t>& k,
                         std::vector<std::vector<uint32_t>>* out) {
  RANK_CUDA(cudaSetDevice(0));
  const uint32_t rank = host.rank(), rows = static_cast<uint32_t>(x.size());
  const uint32_t n_global = static_cast<uint32_t>(x[0].size());
  const uint32_t begin = cut[rank], n = cut[rank + 1] - begin, stride = std::max(n, 1u) + 3;
  std::vector<float> mine(size_t{rows} * stride, 12345.0f);  // the padding is never read
  for (uint32_t r = 0; r < rows; ++r) std::copy_n(x[r].begin() + begin, n, mine.begin() + size_t{r} * stride);
  const uint32_t words = (n + 31) / 32;
  std::vector<uint32_t> b(size_t{rows} * words);
  RankBuf dx, bits;
  RANK_CUDA(cudaMalloc(&dx.p, mine.size() * sizeof(float)));
  RANK_CUDA(cudaMalloc(&bits.p, std::max<size_t>(1, b.size()) * sizeof(uint32_t)));
  RANK_CUDA(cudaMemcpy(dx.p, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  RANK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::PeerCollective peers(host, stream);
  Collective& comm = peer ? static_cast<Collective&>(peers) : host;
  const absl::Status st = cuda::device_sharded_topk(
      comm, cuda::ShardTopkRows{static_cast<const float*>(dx.p), rows, n, stride}, k, n_global, stream,
      static_cast<uint32_t*>(bits.p));
  cudaStreamDestroy(stream);
  SSA_RETURN_IF_ERROR(st);
  RANK_CUDA(cudaMemcpy(b.data(), bits.p, b.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  out->assign(rows, {});
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t i = 0; i < n; ++i)
      if (b[size_t{r} * words + i / 32] >> (i % 32) & 1u) (*out)[r].push_back(begin + i);
  return absl::OkStatus();
}

TEST_CASE("gpu sharded top-k: the set of the whole context, shard by shard the CPU's") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t n = 70001, rows = 8;
  const auto x = make_rows(rows, n, 5);
  ThreadPool pool(2);
  for (uint32_t R = 1; R <= 4; ++R) {
    std::mt19937_64 rng(R);
    std::vector<uint32_t> cut = {0};
    for (uint32_t i = 1; i < R; ++i) cut.push_back(static_cast<uint32_t>(rng() % n));
    if (R == 3) cut[1] = cut[2] = 20000;  // an empty shard
    cut.push_back(n);
    std::sort(cut.begin(), cut.end());
    // Row r's k: none, one, a tenth, a tie run's middle, n - 1, all, more than all, 20000.
    std::vector<uint64_t> k = {0, 1, n / 10, 0, n - 1, n, n + 5, 20000};
    {
      // k inside a run of equal scores: ties decide which members are taken.
      std::vector<float> sorted = x[3];
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      uint64_t i = n / 3;
      while (i + 1 < n && sorted[i + 1] != sorted[i]) ++i;
      k[3] = i + 1;
    }
    std::vector<std::vector<std::vector<uint32_t>>> got(R), by_peers(R), cpu(R);
    InProcessGroup group(R);
    absl::Status st = group.run([&](Collective& c) { return device_rank(c, false, x, cut, k, &got[c.rank()]); });
    INFO("shards ", R, ": ", std::string(st.message()));
    REQUIRE(st.ok());
    st = group.run([&](Collective& c) { return device_rank(c, true, x, cut, k, &by_peers[c.rank()]); });
    REQUIRE(st.ok());
    CHECK(by_peers == got);
    REQUIRE(group
                .run([&](Collective& c) {
                  std::vector<TopkUnit> units(rows);
                  for (uint32_t r = 0; r < rows; ++r)
                    units[r] = TopkUnit{x[r].data() + cut[c.rank()], cut[c.rank() + 1] - cut[c.rank()], k[r], n};
                  std::vector<std::vector<uint32_t>> top;
                  SSA_RETURN_IF_ERROR(sharded_topk(c, pool, units, &top));
                  for (auto& t : top)
                    for (auto& i : t) i += cut[c.rank()];
                  cpu[c.rank()] = std::move(top);
                  return absl::OkStatus();
                })
                .ok());
    for (uint32_t r = 0; r < rows; ++r) {
      INFO("shards ", R, " row ", r, " k ", k[r]);
      std::vector<uint32_t> want, all;
      topk_indices(x[r].data(), n, k[r], 0, &want);
      std::sort(want.begin(), want.end());
      for (uint32_t q = 0; q < R; ++q) {
        CHECK(got[q][r] == cpu[q][r]);
        all.insert(all.end(), got[q][r].begin(), got[q][r].end());
      }
      CHECK(all == want);  // shards in order, each increasing: the sorted set
      CHECK(all.size() == std::min<uint64_t>(k[r], n));
    }
  }
}

TEST_CASE("gpu peer collectives: device buffers reduced and gathered in place, host buffers as the host's") {
  SSA_GPU_TEST_OR_SKIP();
  const size_t n = 300001;  // more than one grid-stride pass
  for (uint32_t R : {1u, 2u, 3u}) {
    INFO("ranks ", R);
    std::vector<std::vector<uint64_t>> sums(R);
    std::vector<std::vector<float>> maxes(R), gathered(R);
    std::vector<std::vector<uint64_t>> host_sums(R);
    InProcessGroup group(R);
    auto value = [](uint32_t r, size_t i) { return uint64_t{r + 1} * 1000003u * (i + 7) % 1000000007u; };
    auto fvalue = [](uint32_t r, size_t i) { return static_cast<float>((i * 7 + r * 13) % 101) - 50.f; };
    const absl::Status st = group.run([&](Collective& host) -> absl::Status {
      RANK_CUDA(cudaSetDevice(0));
      const uint32_t r = host.rank();
      cudaStream_t stream = nullptr;
      RANK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cuda::PeerCollective comm(host, stream);
      std::vector<uint64_t> u(n);
      std::vector<float> f(n);
      for (size_t i = 0; i < n; ++i) {
        u[i] = value(r, i);
        f[i] = fvalue(r, i);
      }
      RankBuf du, df, dg;
      RANK_CUDA(cudaMalloc(&du.p, n * sizeof(uint64_t)));
      RANK_CUDA(cudaMalloc(&df.p, n * sizeof(float)));
      RANK_CUDA(cudaMalloc(&dg.p, R * n * sizeof(float)));
      RANK_CUDA(cudaMemcpyAsync(du.p, u.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice, stream));
      RANK_CUDA(cudaMemcpyAsync(df.p, f.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
      SSA_RETURN_IF_ERROR(comm.all_gather(df.p, n * sizeof(float), dg.p));
      SSA_RETURN_IF_ERROR(comm.all_reduce_sum(static_cast<uint64_t*>(du.p), n));
      SSA_RETURN_IF_ERROR(comm.all_reduce_max(static_cast<float*>(df.p), n));
      host_sums[r] = u;
      SSA_RETURN_IF_ERROR(comm.all_reduce_sum(host_sums[r].data(), n));  // host memory: the host's collective
      sums[r].resize(n);
      maxes[r].resize(n);
      gathered[r].resize(R * n);
      RANK_CUDA(cudaMemcpyAsync(sums[r].data(), du.p, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
      RANK_CUDA(cudaMemcpyAsync(maxes[r].data(), df.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
      RANK_CUDA(cudaMemcpyAsync(gathered[r].data(), dg.p, R * n * sizeof(float), cudaMemcpyDeviceToHost, stream));
      RANK_CUDA(cudaStreamSynchronize(stream));
      cudaStreamDestroy(stream);
      return absl::OkStatus();
    });
    INFO(std::string(st.message()));
    REQUIRE(st.ok());
    size_t bad_sum = 0, bad_max = 0, bad_gather = 0;
    for (uint32_t r = 0; r < R; ++r) {
      for (size_t i = 0; i < n; ++i) {
        uint64_t s = 0;
        float m = -INFINITY;
        for (uint32_t q = 0; q < R; ++q) {
          s += value(q, i);
          m = std::max(m, fvalue(q, i));
          bad_gather += gathered[r][q * n + i] != fvalue(q, i);
        }
        bad_sum += sums[r][i] != s || host_sums[r][i] != s;
        bad_max += maxes[r][i] != m;
      }
    }
    CHECK(bad_sum == 0);
    CHECK(bad_max == 0);
    CHECK(bad_gather == 0);
  }
}

TEST_CASE("gpu sharded top-k: wrong arguments are refused before any work") {
  SSA_GPU_TEST_OR_SKIP();
  InProcessGroup group(1);
  DevBuf<float> x(64);
  DevBuf<uint32_t> bits(2);
  // One k for two rows.
  absl::Status st = group.run([&](Collective& c) {
    return cuda::device_sharded_topk(c, cuda::ShardTopkRows{x.p, 2, 32, 32}, {1}, 32, nullptr, bits.p);
  });
  CHECK(status_code(st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(!st.message().empty());
  // Rows that overlap: a stride below the row length.
  st = group.run([&](Collective& c) {
    return cuda::device_sharded_topk(c, cuda::ShardTopkRows{x.p, 2, 32, 16}, {1, 1}, 32, nullptr, bits.p);
  });
  CHECK(status_code(st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(!st.message().empty());
}

}  // namespace
}  // namespace ssa::gputest
