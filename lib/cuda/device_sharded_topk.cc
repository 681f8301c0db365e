#include "device_sharded_topk.h"

#include <algorithm>

#include "device_error.h"
#include "device_mem.h"
#include "status.h"

namespace ssa::cuda {
namespace {

// data[0..n) of device memory summed over the ranks, in place.
absl::Status all_reduce_device(Collective& comm, unsigned long long* data, size_t n, cudaStream_t stream) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "counts are 64-bit");
  if (comm.takes_device_buffers()) {
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "sharded top-k histogram");
    return comm.all_reduce_sum(reinterpret_cast<uint64_t*>(data), n);
  }
  std::vector<uint64_t> host(n);
  SSA_CUDA_RETURN(cudaMemcpyAsync(host.data(), data, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream),
                  "sharded top-k histogram read-back");
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "sharded top-k histogram read-back");
  SSA_RETURN_IF_ERROR(comm.all_reduce_sum(host.data(), n));
  SSA_CUDA_RETURN(cudaMemcpyAsync(data, host.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice, stream),
                  "sharded top-k histogram upload");
  // The host vector goes out of scope: the copy must be done.
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "sharded top-k histogram upload");
  return absl::OkStatus();
}

}  // namespace

absl::Status device_sharded_topk(Collective& comm, const ShardTopkRows& rows_in, const std::vector<uint64_t>& k,
                                 uint64_t n_global, cudaStream_t stream, uint32_t* bits) {
  return device_sharded_topk(comm, rows_in, k, std::vector<uint64_t>(k.size(), n_global), stream, bits);
}

absl::Status device_sharded_topk(Collective& comm, const ShardTopkRows& rows_in, const std::vector<uint64_t>& k,
                                 const std::vector<uint64_t>& n_global, cudaStream_t stream, uint32_t* bits) {
  const ShardTopkRows& r = rows_in;
  if (k.size() != r.rows || n_global.size() != r.rows)
    return invalid_argument("sharded top-k: ", k.size(), " k values and ", n_global.size(), " totals for ", r.rows,
                            " rows");
  if (r.offsets == nullptr && r.n > r.stride && r.rows > 1)
    return invalid_argument("sharded top-k: row stride below the row length");
  const uint32_t U = r.rows, chunks = std::max(1u, shard_topk_chunks(r.n));
  std::vector<ShardTopkState> st(U);
  bool any_active = false;
  for (uint32_t u = 0; u < U; ++u) {
    st[u] = ShardTopkState{0, k[u] > 0 && k[u] < n_global[u], k[u] > 0 && k[u] >= n_global[u], 0, k[u]};
    any_active = any_active || st[u].active;
  }
  DeviceMem state, hist, ties, chunk_ties, take;
  SSA_CUDA_RETURN(state.alloc(U * sizeof(ShardTopkState), stream), "cudaMallocAsync of the top-k state");
  SSA_CUDA_RETURN(cudaMemcpyAsync(state.p, st.data(), U * sizeof(ShardTopkState), cudaMemcpyHostToDevice, stream),
                  "top-k state upload");
  auto* dst = static_cast<ShardTopkState*>(state.p);
  // Zeroed whether or not a row needs the rounds: the marking pass reads them for every row.
  SSA_CUDA_RETURN(ties.alloc(U * sizeof(unsigned long long), stream), "cudaMallocAsync of the top-k ties");
  SSA_CUDA_RETURN(chunk_ties.alloc(size_t{U} * chunks * sizeof(uint32_t), stream),
                  "cudaMallocAsync of the top-k ties");
  SSA_CUDA_RETURN(cudaMemsetAsync(ties.p, 0, U * sizeof(unsigned long long), stream), "top-k ties");
  SSA_CUDA_RETURN(cudaMemsetAsync(chunk_ties.p, 0, size_t{U} * chunks * sizeof(uint32_t), stream), "top-k ties");
  std::vector<unsigned long long> take_host(U, 0);
  if (any_active) {  // the same on every rank: the same k and n_global
    SSA_CUDA_RETURN(hist.alloc(size_t{U} * shard_topk_bins(0) * sizeof(unsigned long long), stream),
                    "cudaMallocAsync of the top-k histograms");
    auto* h = static_cast<unsigned long long*>(hist.p);
    for (int round = 0; round < kShardedTopkRounds; ++round) {
      const size_t n = size_t{U} * shard_topk_bins(round);
      SSA_CUDA_RETURN(cudaMemsetAsync(h, 0, n * sizeof(unsigned long long), stream), "top-k histogram");
      SSA_CUDA_RETURN(shard_topk_histogram(r, dst, round, h, stream), "top-k histogram kernel");
      SSA_RETURN_IF_ERROR(all_reduce_device(comm, h, n, stream));
      SSA_CUDA_RETURN(shard_topk_pick(U, round, h, dst, stream), "top-k bin kernel");
    }
    SSA_CUDA_RETURN(shard_topk_ties(r, dst, static_cast<unsigned long long*>(ties.p),
                                    static_cast<uint32_t*>(chunk_ties.p), stream),
                    "top-k tie kernel");
    std::vector<unsigned long long> mine(U);
    SSA_CUDA_RETURN(cudaMemcpyAsync(st.data(), state.p, U * sizeof(ShardTopkState), cudaMemcpyDeviceToHost, stream),
                    "top-k state read-back");
    SSA_CUDA_RETURN(cudaMemcpyAsync(mine.data(), ties.p, U * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                    stream),
                    "top-k ties read-back");
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "top-k ties read-back");
    // need[u] of the keys equal to T are taken, lowest shards first.
    std::vector<unsigned long long> all(size_t{comm.size()} * U);
    SSA_RETURN_IF_ERROR(comm.all_gather(mine.data(), U * sizeof(unsigned long long), all.data()));
    for (uint32_t u = 0; u < U; ++u) {
      if (!st[u].active) continue;
      unsigned long long before = 0;
      for (uint32_t q = 0; q < comm.rank(); ++q) before += all[size_t{q} * U + u];
      take_host[u] = st[u].need > before ? st[u].need - before : 0;
    }
  }
  SSA_CUDA_RETURN(take.alloc(U * sizeof(unsigned long long), stream), "cudaMallocAsync of the top-k takes");
  SSA_CUDA_RETURN(cudaMemcpyAsync(take.p, take_host.data(), U * sizeof(unsigned long long), cudaMemcpyHostToDevice,
                                  stream),
                  "top-k takes upload");
  SSA_CUDA_RETURN(shard_topk_mark(r, dst, static_cast<const uint32_t*>(chunk_ties.p),
                                  static_cast<const unsigned long long*>(take.p), bits, stream),
                  "top-k mark kernel");
  // take_host is read by the copy above.
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "sharded top-k");
  return absl::OkStatus();
}

}  // namespace ssa::cuda
