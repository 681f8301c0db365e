// The top-k boundary of a row from its score histogram: which bin holds the k-th
// largest candidate score and how many of that bin's candidates are still needed
// (the bins above it are selected outright). Resolved by the last block to finish
// counting a row's histogram: the PQ scoring kernel, which counts it while it
// scores, or the histogram kernel of the exact proxy.
#pragma once

#include <cub/block/block_scan.cuh>

#include "decode_types.h"

namespace ssa::cuda {

// Called by every thread after the block's atomics into the histograms: whether
// this block is the last of `expected` to arrive at *counter. Then every other
// block's counts are visible (read them with __ldcg, from L2).
__device__ __forceinline__ bool last_block_to_finish(uint32_t* counter, uint32_t expected) {
  __shared__ bool last_s;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_s = atomicAdd(counter, 1u) == expected - 1;
  __syncthreads();
  if (last_s) __threadfence();
  return last_s;
}

template <int kThreads>
using BoundaryScan = cub::BlockScan<uint32_t, kThreads>;

// Sets st.cut_bin and st.cut_need (or, when the row has at most topk_k
// candidates, selects them all). Every thread of the block must call it; it may be
// called again for another row straight after. tmp: shared memory of the caller's
// choosing (the scoring kernel lends a buffer it is done with, to stay at two
// blocks per multiprocessor).
template <int kThreads>
__device__ void resolve_topk_boundary(const DecodeBatch& b, RowState& st, const uint32_t* hist,
                                      typename BoundaryScan<kThreads>::TempStorage& tmp) {
  static_assert(kScoreBins % kThreads == 0, "whole bins per thread");
  constexpr uint32_t kBinsPerThread = kScoreBins / kThreads;
  using Scan = BoundaryScan<kThreads>;
  const uint32_t k = st.topk_k;
  uint32_t c[kBinsPerThread], mine = 0;
#pragma unroll
  for (uint32_t i = 0; i < kBinsPerThread; ++i) {
    c[i] = __ldcg(&hist[threadIdx.x * kBinsPerThread + i]);  // other blocks' atomics: from L2
    mine += c[i];
  }
  uint32_t run, total;
  Scan(tmp).ExclusiveSum(mine, run, total);
  if (total <= k) {  // every candidate is selected
    if (threadIdx.x == 0) {
      st.topk_k = total;
      if (b.heavy == HeavyRule::kFixed) st.n_heavy = total;
      st.cut_bin = kScoreBins;
      st.cut_need = 0;
    }
  } else {
#pragma unroll
    for (uint32_t i = 0; i < kBinsPerThread; ++i) {
      if (run < k && k <= run + c[i]) {
        st.cut_bin = threadIdx.x * kBinsPerThread + i;
        st.cut_need = k - run;
      }
      run += c[i];
    }
  }
  __syncthreads();  // tmp may be reused
}

}  // namespace ssa::cuda
