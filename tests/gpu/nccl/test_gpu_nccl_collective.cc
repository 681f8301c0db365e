// The NCCL collectives (lib/shard/nccl) on every GPU of the machine (up to 8),
// one rank per GPU on a thread of its own, against the in-process collectives
// the CPU backend's shards use: the same program of all-reduces, all-gathers
// and the shards' global top-k gives bitwise the same results, with host and
// with device buffers; the CUDA sharded top-k over the communicator picks the
// same members. With one GPU the communicator has one rank (every result
// is then the rank's own); the multi-rank cases need 2+ GPUs. NVLink multicast
// stays off (NCCL_NVLS_ENABLE=0, set before any communicator is made).
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "cuda/device_sharded_topk.h"
#include "select/radix_topk.h"
#include "shard/in_process_collective.h"
#include "shard/nccl/nccl_collective.h"
#include "shard/sharded_topk.h"
#include "status.h"

namespace {

constexpr int kSkipped = 77;

// What one rank's program produced.
struct Results {
  std::vector<uint64_t> sums;
  std::vector<float> maxima;
  std::vector<uint8_t> gathered;
  std::vector<uint32_t> topk;  // global indices of this rank's members
  std::vector<uint32_t> device_topk;  // the same by the CUDA sharded top-k (device buffers only)
};

// Rank r's inputs and the same operations, through `comm`; device: the buffers
// of the reductions and the gather live in device memory of the current device.
absl::Status program(ssa::Collective& comm, bool device, const std::vector<float>& scores,
                     const std::vector<size_t>& cut, Results* out) {
  const uint32_t r = comm.rank(), R = comm.size();
  std::mt19937_64 rng(1000 + r);
  std::vector<uint64_t> sums(4097);
  for (auto& v : sums) v = rng() >> 8;  // large: carries across 32-bit words
  std::vector<float> maxima(333);
  for (size_t i = 0; i < maxima.size(); ++i) {
    maxima[i] = i % 7 == 0 ? -INFINITY : std::normal_distribution<float>(0.0f, 5.0f)(rng);
  }
  std::vector<uint8_t> send(1000 + 37), gathered(send.size() * R);
  for (auto& b : send) b = static_cast<uint8_t>(rng());
  if (device) {
    uint64_t* ds = nullptr;
    float* dm = nullptr;
    uint8_t *dsend = nullptr, *drecv = nullptr;
    if (cudaMalloc(&ds, sums.size() * 8) != cudaSuccess || cudaMalloc(&dm, maxima.size() * 4) != cudaSuccess ||
        cudaMalloc(&dsend, send.size()) != cudaSuccess || cudaMalloc(&drecv, gathered.size()) != cudaSuccess) {
      return ssa::make_error(SSA_ERR_DEVICE, "cudaMalloc");
    }
    cudaMemcpy(ds, sums.data(), sums.size() * 8, cudaMemcpyHostToDevice);
    cudaMemcpy(dm, maxima.data(), maxima.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dsend, send.data(), send.size(), cudaMemcpyHostToDevice);
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(ds, sums.size()));
    SSA_RETURN_IF_ERROR(comm.all_reduce_max(dm, maxima.size()));
    SSA_RETURN_IF_ERROR(comm.all_gather(dsend, send.size(), drecv));
    cudaMemcpy(sums.data(), ds, sums.size() * 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(maxima.data(), dm, maxima.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(gathered.data(), drecv, gathered.size(), cudaMemcpyDeviceToHost);
    cudaFree(ds);
    cudaFree(dm);
    cudaFree(dsend);
    cudaFree(drecv);
  } else {
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(sums.data(), sums.size()));
    SSA_RETURN_IF_ERROR(comm.all_reduce_max(maxima.data(), maxima.size()));
    SSA_RETURN_IF_ERROR(comm.all_gather(send.data(), send.size(), gathered.data()));
  }
  // The sharded selection's top-k runs on host buffers (staged by NCCL).
  ssa::ThreadPool pool(2);
  const size_t n = scores.size();
  std::vector<ssa::TopkUnit> units = {{scores.data() + cut[r], cut[r + 1] - cut[r], n / 7, n}};
  std::vector<std::vector<uint32_t>> top;
  SSA_RETURN_IF_ERROR(ssa::sharded_topk(comm, pool, units, &top));
  for (uint32_t i : top[0]) out->topk.push_back(static_cast<uint32_t>(cut[r] + i));
  if (device) {
    // The CUDA sharded top-k: the scores stay in this rank's device memory.
    const uint32_t m = static_cast<uint32_t>(cut[r + 1] - cut[r]), words = (m + 31) / 32;
    float* dx = nullptr;
    uint32_t* dbits = nullptr;
    if (cudaMalloc(&dx, std::max<size_t>(m, 1) * 4) != cudaSuccess ||
        cudaMalloc(&dbits, std::max<size_t>(words, 1) * 4) != cudaSuccess) {
      return ssa::make_error(SSA_ERR_DEVICE, "cudaMalloc");
    }
    cudaMemcpy(dx, scores.data() + cut[r], size_t{m} * 4, cudaMemcpyHostToDevice);
    SSA_RETURN_IF_ERROR(ssa::cuda::device_sharded_topk(comm, ssa::cuda::ShardTopkRows{dx, 1, m, m}, {n / 7}, n,
                                                       nullptr, dbits));
    std::vector<uint32_t> bits(words);
    cudaMemcpy(bits.data(), dbits, size_t{words} * 4, cudaMemcpyDeviceToHost);
    for (uint32_t i = 0; i < m; ++i)
      if (bits[i / 32] >> (i % 32) & 1u) out->device_topk.push_back(static_cast<uint32_t>(cut[r] + i));
    cudaFree(dx);
    cudaFree(dbits);
  }
  out->sums = std::move(sums);
  out->maxima = std::move(maxima);
  out->gathered = std::move(gathered);
  return absl::OkStatus();
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return std::min(n, 8);
}

}  // namespace

TEST_CASE("nccl collectives: bitwise the in-process results, host and device buffers, and the global top-k") {
  const int R = device_count();
  REQUIRE(R >= 1);
  MESSAGE("ranks (GPUs): ", R);
  // Scores with ties, cut unevenly over the ranks.
  std::mt19937_64 rng(3);
  std::vector<float> scores(50000);
  for (auto& x : scores) x = static_cast<float>(static_cast<int>(rng() % 200)) * 0.25f;
  std::vector<size_t> cut = {0};
  for (int r = 1; r < R; ++r) cut.push_back(rng() % scores.size());
  cut.push_back(scores.size());
  std::sort(cut.begin(), cut.end());
  std::vector<uint32_t> want;
  ssa::topk_indices(scores.data(), scores.size(), scores.size() / 7, 0, &want);
  std::sort(want.begin(), want.end());

  std::vector<Results> ref(R);
  ssa::InProcessGroup group(static_cast<uint32_t>(R));
  REQUIRE(group.run([&](ssa::Collective& c) { return program(c, false, scores, cut, &ref[c.rank()]); }).ok());

  std::vector<ncclComm_t> comms(R);
  std::vector<int> devs(R);
  for (int r = 0; r < R; ++r) devs[r] = r;
  REQUIRE(ncclCommInitAll(comms.data(), R, devs.data()) == ncclSuccess);
  for (bool device : {false, true}) {
    CAPTURE(device);
    std::vector<Results> got(R);
    std::vector<absl::Status> st(R);
    std::vector<std::thread> threads;
    for (int r = 0; r < R; ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(r);
        cudaStream_t s = nullptr;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        auto comm = ssa::NcclCollective::create(comms[r], s);
        st[r] = comm.ok() ? program(**comm, device, scores, cut, &got[r]) : comm.status();
        comm = absl::StatusOr<std::unique_ptr<ssa::NcclCollective>>(nullptr);
        cudaStreamDestroy(s);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<uint32_t> topk;
    for (int r = 0; r < R; ++r) {
      CAPTURE(r);
      REQUIRE_MESSAGE(st[r].ok(), std::string(st[r].message()));
      CHECK(got[r].sums == ref[r].sums);
      CHECK(memcmp(got[r].maxima.data(), ref[r].maxima.data(), ref[r].maxima.size() * 4) == 0);
      CHECK(got[r].gathered == ref[r].gathered);
      CHECK(got[r].topk == ref[r].topk);
      if (device) CHECK(got[r].device_topk == ref[r].topk);
      topk.insert(topk.end(), got[r].topk.begin(), got[r].topk.end());
    }
    std::sort(topk.begin(), topk.end());
    CHECK(topk == want);
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
  if (device_count() == 0) {
    printf("skipped: no CUDA device\n");
    return kSkipped;
  }
  return doctest::Context(argc, argv).run();
}
