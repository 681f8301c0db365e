// The device passes of the global top-k over shards (sharded_topk.h). Every pass
// runs one block per (chunk of kShardTopkChunk elements, row); in the marking
// pass a thread owns one word (32 consecutive elements) of the bitmap.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sharded_topk.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = kShardTopkChunk / 32;  // 256
static_assert(kThreads == 256, "one word per thread");

__device__ __forceinline__ const float* row_scores(const ShardTopkRows& r, uint32_t row) {
  return r.x + (r.offsets != nullptr ? r.offsets[row] : size_t{row} * r.stride);
}
__device__ __forceinline__ uint32_t row_length(const ShardTopkRows& r, uint32_t row) {
  return r.counts != nullptr ? r.counts[row] : r.n;
}

__global__ void __launch_bounds__(kThreads)
    histogram_kernel(ShardTopkRows r, const ShardTopkState* st, int round, unsigned long long* hist) {
  __shared__ uint32_t h[4096];
  const uint32_t row = blockIdx.y;
  const ShardTopkState s = st[row];
  if (!s.active) return;
  const uint32_t bins = shard_topk_bins(round);
  for (uint32_t i = threadIdx.x; i < bins; i += kThreads) h[i] = 0;
  __syncthreads();
  const int shift = sharded_topk_shift(round), above = shift + sharded_topk_bits(round);
  const float* x = row_scores(r, row);
  const uint32_t begin = blockIdx.x * kShardTopkChunk, end = min(row_length(r, row), begin + kShardTopkChunk);
  // Consecutive threads on consecutive elements here (only counts are kept).
  // Scores crowd into few bins (the first round's are sign, exponent and three
  // mantissa bits), so the lanes of a warp that share a bin add once, through
  // their lowest lane: one shared-memory atomic per distinct bin, not per element.
  // Whole warps run the loop (a chunk's elements are a multiple of 32 but for
  // the row's last), lanes past the end with no bin.
  constexpr uint32_t kNone = ~0u;
  for (uint32_t i0 = begin + (threadIdx.x & ~31u); i0 < end; i0 += kThreads) {
    const uint32_t i = i0 + (threadIdx.x & 31u);
    uint32_t bin = kNone;
    if (i < end) {
      const uint32_t key = float_order_key(x[i]);
      if (round == 0 || (key >> above) == s.prefix) bin = (key >> shift) & (bins - 1);
    }
    const uint32_t same = __match_any_sync(0xffffffffu, bin);
    if (bin != kNone && (threadIdx.x & 31u) == static_cast<uint32_t>(__ffs(same) - 1))
      atomicAdd(&h[bin], static_cast<uint32_t>(__popc(same)));
  }
  __syncthreads();
  unsigned long long* out = hist + size_t{row} * bins;
  for (uint32_t i = threadIdx.x; i < bins; i += kThreads)
    if (h[i] != 0) atomicAdd(&out[i], static_cast<unsigned long long>(h[i]));
}

// One block per row. In descending bin order, the bin where the running count
// reaches need: the highest bin b with (count above b) < need <= (count above b)
// + hist[b], as the CPU's loop from the top bin finds it (bin 0 if none).
__global__ void __launch_bounds__(kThreads)
    pick_kernel(int round, const unsigned long long* hist, ShardTopkState* st) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ uint32_t found_bin;
  __shared__ unsigned long long found_above, above_bin0;
  const uint32_t row = blockIdx.x;
  ShardTopkState s = st[row];
  if (!s.active) return;
  const uint32_t bins = shard_topk_bins(round), per = bins / kThreads;
  const unsigned long long* h = hist + size_t{row} * bins;
  // Thread t: descending positions [t * per, (t + 1) * per), bin = bins - 1 - position.
  unsigned long long mine = 0;
  for (uint32_t j = 0; j < per; ++j) mine += h[bins - 1 - (threadIdx.x * per + j)];
  unsigned long long run;
  Scan(tmp).ExclusiveSum(mine, run);
  if (threadIdx.x == 0) found_bin = bins;  // none yet
  __syncthreads();
  for (uint32_t j = 0; j < per; ++j) {
    const uint32_t bin = bins - 1 - (threadIdx.x * per + j);
    const unsigned long long c = h[bin];
    if (bin == 0) above_bin0 = run;
    if (run < s.need && s.need <= run + c && bin > 0) {
      found_bin = bin;  // one thread at most: counts are non-negative
      found_above = run;
    }
    run += c;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t bin = found_bin == bins ? 0u : found_bin;
  const unsigned long long above = found_bin == bins ? above_bin0 : found_above;
  s.need -= above;
  s.prefix = (s.prefix << sharded_topk_bits(round)) | bin;
  st[row] = s;
}

__global__ void __launch_bounds__(kThreads)
    ties_kernel(ShardTopkRows r, const ShardTopkState* st, unsigned long long* ties, uint32_t* chunk_ties) {
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const uint32_t row = blockIdx.y, chunks = gridDim.x;
  const ShardTopkState s = st[row];
  uint32_t c = 0;
  if (s.active) {
    const float* x = row_scores(r, row);
    const uint32_t begin = blockIdx.x * kShardTopkChunk, end = min(row_length(r, row), begin + kShardTopkChunk);
    for (uint32_t i = begin + threadIdx.x; i < end; i += kThreads) c += float_order_key(x[i]) == s.prefix;
  }
  const uint32_t total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) {
    chunk_ties[size_t{row} * chunks + blockIdx.x] = total;
    if (total != 0) atomicAdd(&ties[row], static_cast<unsigned long long>(total));
  }
}

__global__ void __launch_bounds__(kThreads)
    mark_kernel(ShardTopkRows r, const ShardTopkState* st, const uint32_t* chunk_ties,
                const unsigned long long* take, uint32_t* bits) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ typename Reduce::TempStorage reduce_tmp;
  const uint32_t row = blockIdx.y, chunks = gridDim.x;
  const ShardTopkState s = st[row];
  const uint32_t words = (r.n + 31) / 32;
  const uint32_t word = blockIdx.x * kThreads + threadIdx.x;  // this thread's word of the row
  const uint32_t i0 = word * 32;
  const float* x = row_scores(r, row);
  const uint32_t n = row_length(r, row);
  uint32_t above = 0, equal = 0;
  if (s.active) {  // the same for the whole block (one row)
    // The warp's 32 words one after another, each loaded by the 32 lanes at
    // once (coalesced) and voted into the word of the lane that owns it.
    const uint32_t lane = threadIdx.x & 31u, warp_word0 = word - lane;
    for (uint32_t j = 0; j < 32; ++j) {
      const uint32_t i = (warp_word0 + j) * 32 + lane;
      const uint32_t key = i < n ? float_order_key(x[i]) : 0u;
      const uint32_t a = __ballot_sync(0xffffffffu, i < n && key > s.prefix);
      const uint32_t e = __ballot_sync(0xffffffffu, i < n && key == s.prefix);
      if (lane == j) {
        above = a;
        equal = e;
      }
    }
  }
  // Ties before this thread's word: in earlier chunks, then earlier threads.
  unsigned long long before = 0;
  for (uint32_t c = threadIdx.x; c < blockIdx.x; c += kThreads) before += chunk_ties[size_t{row} * chunks + c];
  before = Reduce(reduce_tmp).Sum(before);
  __shared__ unsigned long long chunk_before;
  if (threadIdx.x == 0) chunk_before = before;
  uint32_t mine;
  Scan(scan_tmp).ExclusiveSum(static_cast<uint32_t>(__popc(equal)), mine);
  __syncthreads();
  if (word >= words) return;
  uint32_t out = 0;
  if (s.all) {
    out = i0 >= n ? 0u : i0 + 32 > n ? (1u << (n - i0)) - 1u : ~0u;
  } else if (s.active) {
    out = above;
    const unsigned long long t = take[row];
    unsigned long long rank = chunk_before + mine;
    for (uint32_t m = equal; m != 0 && rank < t; m &= m - 1, ++rank) out |= m & (~m + 1);  // lowest set bit
  }
  bits[size_t{row} * words + word] = out;
}

}  // namespace

cudaError_t shard_topk_histogram(const ShardTopkRows& r, const ShardTopkState* st, int round,
                                 unsigned long long* hist, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return cudaSuccess;
  histogram_kernel<<<dim3(shard_topk_chunks(r.n), r.rows), kThreads, 0, stream>>>(r, st, round, hist);
  return cudaGetLastError();
}

cudaError_t shard_topk_pick(uint32_t rows, int round, const unsigned long long* hist, ShardTopkState* st,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  pick_kernel<<<rows, kThreads, 0, stream>>>(round, hist, st);
  return cudaGetLastError();
}

cudaError_t shard_topk_ties(const ShardTopkRows& r, const ShardTopkState* st, unsigned long long* ties,
                            uint32_t* chunk_ties, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return cudaSuccess;
  ties_kernel<<<dim3(shard_topk_chunks(r.n), r.rows), kThreads, 0, stream>>>(r, st, ties, chunk_ties);
  return cudaGetLastError();
}

cudaError_t shard_topk_mark(const ShardTopkRows& r, const ShardTopkState* st, const uint32_t* chunk_ties,
                            const unsigned long long* take, uint32_t* bits, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return cudaSuccess;
  mark_kernel<<<dim3(shard_topk_chunks(r.n), r.rows), kThreads, 0, stream>>>(r, st, chunk_ties, take, bits);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
