// The boundary bin of a row's top-k histogram: which bin holds the k-th largest
// candidate score and how many of its candidates are still needed. Every block
// of the top-k filter (topk_select.cu) finds it for itself at its start, from the
// complete histogram in L2 (4 KB a row): no launch of its own, and no wait at the
// end of the kernel that builds the histogram for its last block to resolve it.
#pragma once

#include <cub/block/block_scan.cuh>

#include "device_util.cuh"

namespace ssa::cuda {

struct TopkCut {
  uint32_t k;         // candidates selected: topk_k, or all of them when fewer
  uint32_t cut_bin;   // bins < cut_bin are selected outright (kScoreBins: every bin)
  uint32_t cut_need;  // ... and this many of bin cut_bin's candidates
};

// Every thread of a block of kThreads threads calls it, for a row with k > 0
// whose histogram `hist` (global, kScoreBins counts, bin 0 nearest the top) is
// complete; every thread gets the result. The same in every block.
template <int kThreads>
__device__ TopkCut find_topk_cut(const uint32_t* hist, uint32_t k) {
  static_assert(kScoreBins == 4 * kThreads, "one 16-byte load of four bins per thread");
  using Scan = cub::BlockScan<uint32_t, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;  // little shared memory
  __shared__ typename Scan::TempStorage tmp;
  __shared__ TopkCut cut_s;
  // Other blocks' atomics: read from L2.
  const uint4 c = __ldcg(reinterpret_cast<const uint4*>(hist) + threadIdx.x);
  uint32_t run, total;
  Scan(tmp).ExclusiveSum(c.x + c.y + c.z + c.w, run, total);
  if (total <= k) return {total, kScoreBins, 0};  // every candidate is selected
  const uint32_t bin0 = 4 * threadIdx.x;
  const uint32_t counts[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
    if (run < k && k <= run + counts[i]) cut_s = {k, bin0 + i, k - run};
    run += counts[i];
  }
  __syncthreads();
  return cut_s;
}

}  // namespace ssa::cuda
