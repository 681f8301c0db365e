// Radix top-k of each row's candidate scores: histograms of the order-preserving
// score bits, 8 bits a pass from the high end, each narrowing the bucket that holds
// the k-th largest value, until its exact bits (the threshold) and the number of
// threshold-equal values still needed are known. No sort. The selection is then
// compacted in token order (values above the threshold, then the first needed
// equal ones), so the output is deterministic and independent of thread timing.
// Several blocks share a row; the per-pass histograms live in global memory and a
// one-block-per-row step after each pass narrows the prefix (kept in RowState).
#include <cub/block/block_scan.cuh>

#include "device_util.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;

struct RowSpan {
  const float* scores;
  uint32_t begin, end;  // this block's token range
  uint32_t k;
  uint32_t* out;
};

__device__ RowSpan row_span(const DecodeBatch& b, const Workspace& ws, uint32_t nblk) {
  const uint32_t item = blockIdx.z, h = blockIdx.y;
  const DecodeItem& it = b.items[item];
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  RowSpan r;
  r.scores = ws.scores + it.score_base + size_t{h} * it.n_pad;
  r.k = ws.rows[row].topk_k;
  const uint32_t range = (it.n_tokens + nblk - 1) / nblk;
  r.begin = min(it.n_tokens, blockIdx.x * range);
  r.end = min(it.n_tokens, r.begin + range);
  r.out = ws.heavy + it.select_base + size_t{h} * it.select_cap;
  return r;
}

// After histogram pass `pass` of a row: the bin holding the k-th largest value
// (counting down from the top bin) extends the prefix; the values above that bin
// leave the count still needed. One block per row, one thread per bin.
__global__ void __launch_bounds__(256) radix_resolve_kernel(DecodeBatch b, Workspace ws, int pass) {
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  RowState& st = ws.rows[row];
  if (st.topk_k == 0) return;
  using Scan = cub::BlockScan<uint32_t, 256>;
  __shared__ typename Scan::TempStorage tmp;
  const uint32_t bin = 255u - threadIdx.x;  // thread 0 holds the top bin
  const uint32_t c = ws.hist[(size_t{row} * 4 + pass) * 256 + bin];
  const uint32_t kr = st.radix_remaining;
  uint32_t incl;
  Scan(tmp).InclusiveSum(c, incl);
  const uint32_t excl = incl - c;
  __syncthreads();
  if (excl < kr && kr <= incl) {
    st.radix_prefix |= bin << (24 - 8 * pass);
    st.radix_remaining = kr - excl;
  }
}

__global__ void __launch_bounds__(kThreads) radix_hist_kernel(DecodeBatch b, Workspace ws,
                                                              uint32_t nblk, int pass) {
  const RowSpan r = row_span(b, ws, nblk);
  if (r.k == 0 || r.begin >= r.end) return;
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  uint32_t* hist_row = ws.hist + size_t{row} * 4 * 256;
  __shared__ uint32_t hist_s[256];
  hist_s[threadIdx.x] = 0;
  __syncthreads();
  const uint32_t prefix = ws.rows[row].radix_prefix;
  const uint32_t mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
  const int shift = 24 - 8 * pass;
  // Scores cluster in few bins (high passes): lanes of a warp with the same bin
  // add once, by their leader. Trip count uniform per warp.
  const uint32_t lane = threadIdx.x & 31;
  for (uint32_t base = r.begin; base < r.end; base += kThreads) {
    const uint32_t t = base + threadIdx.x;
    uint32_t bin = 0xffffffffu;
    if (t < r.end) {
      const uint32_t key = float_key(r.scores[t]);
      if ((key & mask) == prefix) bin = (key >> shift) & 255u;
    }
    const uint32_t peers = __match_any_sync(0xffffffffu, bin);
    if (bin != 0xffffffffu && lane == static_cast<uint32_t>(__ffs(peers) - 1)) {
      atomicAdd(&hist_s[bin], static_cast<uint32_t>(__popc(peers)));
    }
  }
  __syncthreads();
  const uint32_t c = hist_s[threadIdx.x];
  if (c) atomicAdd(&hist_row[pass * 256 + threadIdx.x], c);
}

__global__ void __launch_bounds__(kThreads) radix_count_kernel(DecodeBatch b, Workspace ws,
                                                               uint32_t nblk) {
  const RowSpan r = row_span(b, ws, nblk);
  if (r.k == 0) return;
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  __shared__ uint32_t gt_s, eq_s;
  if (threadIdx.x == 0) {
    gt_s = 0;
    eq_s = 0;
  }
  __syncthreads();
  const uint32_t thr = ws.rows[row].radix_prefix;
  uint32_t gt = 0, eq = 0;
  for (uint32_t t = r.begin + threadIdx.x; t < r.end; t += kThreads) {
    const uint32_t key = float_key(r.scores[t]);
    gt += key > thr;
    eq += key == thr;
  }
  gt = __reduce_add_sync(0xffffffffu, gt);
  eq = __reduce_add_sync(0xffffffffu, eq);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&gt_s, gt);
    atomicAdd(&eq_s, eq);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* c = ws.blkcnt + (size_t{row} * kMaxRadixBlocks + blockIdx.x) * 2;
    c[0] = gt_s;
    c[1] = eq_s;
  }
}

__global__ void __launch_bounds__(kThreads) radix_write_kernel(DecodeBatch b, Workspace ws,
                                                               uint32_t nblk) {
  const RowSpan r = row_span(b, ws, nblk);
  if (r.k == 0 || r.begin >= r.end) return;
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t og_s, oe_s;
  if (threadIdx.x == 0) {
    const uint32_t* c = ws.blkcnt + size_t{row} * kMaxRadixBlocks * 2;
    uint32_t og = 0, oe = 0;
    for (uint32_t i = 0; i < blockIdx.x; ++i) {
      og += c[2 * i];
      oe += c[2 * i + 1];
    }
    og_s = og;
    oe_s = oe;
  }
  __syncthreads();
  const uint32_t thr = ws.rows[row].radix_prefix, need_eq = ws.rows[row].radix_remaining;
  const uint32_t gt_total = r.k - need_eq;
  uint32_t og = og_s, oe = oe_s;
  for (uint32_t base = r.begin; base < r.end; base += kThreads) {
    const uint32_t t = base + threadIdx.x;
    uint32_t key = 0;
    if (t < r.end) key = float_key(r.scores[t]);
    const bool is_gt = t < r.end && key > thr;
    const bool is_eq = t < r.end && key == thr;
    const uint32_t packed = (is_gt ? 1u << 16 : 0u) | (is_eq ? 1u : 0u);
    uint32_t rank, total;
    Scan(scan_tmp).ExclusiveSum(packed, rank, total);
    if (is_gt) r.out[og + (rank >> 16)] = t;
    if (is_eq) {
      const uint32_t e = oe + (rank & 0xffffu);
      if (e < need_eq) r.out[gt_total + e] = t;
    }
    og += total >> 16;
    oe += total & 0xffffu;
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_radix_topk(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                              cudaStream_t st) {
  const dim3 grid(plan.radix_blocks, b.shape.n_q_heads, b.n_items);
  cudaError_t e = cudaMemsetAsync(ws.hist, 0, size_t{plan.rows} * 4 * 256 * sizeof(uint32_t), st);
  if (e != cudaSuccess) return e;
  for (int pass = 0; pass < 4; ++pass) {
    radix_hist_kernel<<<grid, kThreads, 0, st>>>(b, ws, plan.radix_blocks, pass);
    radix_resolve_kernel<<<dim3(1, b.shape.n_q_heads, b.n_items), 256, 0, st>>>(b, ws, pass);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  radix_count_kernel<<<grid, kThreads, 0, st>>>(b, ws, plan.radix_blocks);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  radix_write_kernel<<<grid, kThreads, 0, st>>>(b, ws, plan.radix_blocks);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
