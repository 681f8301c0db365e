// Bitmaps of the selection -> the lists the attention kernel reads, in token order
// (the attention's floating-point order is then fixed). One kernel over the
// bitmap words of every row, many blocks per row: each block counts the set bits
// of its words, publishes its count with a ready flag, adds up the counts of the
// blocks before it in the row as they appear (look-back: blocks are started in
// index order, so every block it waits for has started), scans its own and writes.
// No separate kernel counts first (one launch and one pass fewer). The counts are zeroed
// with the row states at the start of each decode, one set per compaction pass.
// With samples it also computes each sample's log inclusion probability,
//   p = w / W_R, pi = 1 - (1 - p)^m (common/inclusion_probability.h),
// from the sample's own proxy weight.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/inclusion_probability.h"
#include "device_util.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;

struct Span {
  const DecodeItem* it;
  RowState* st;
  uint32_t h, nc, w0, w1;  // this block's bitmap words [w0, w1)
  const uint32_t* hb;
  const uint32_t* sb;
  uint64_t* counts;  // per block of this row: kCountReady | heavy bits << 32 | sample bits
  __device__ bool sparse() const { return item_selects(*it); }
};

// A block's count is published with this bit set; a block holds at most 2^15
// heavy bits, so the counts never reach it.
constexpr uint64_t kCountReady = 1ull << 63;

__device__ Span span_here(const DecodeBatch& b, const Workspace& ws, uint32_t words_per_block,
                          uint32_t pass) {
  Span p;
  p.it = &b.item(blockIdx.z);
  p.h = blockIdx.y;
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.sel_heads());
  p.st = &ws.rows[row];
  p.nc = p.it->local_begin - p.it->sink_end;
  const uint32_t words = (p.nc + 31) / 32;
  p.w0 = min(words, blockIdx.x * words_per_block);
  p.w1 = min(words, p.w0 + words_per_block);
  const size_t base = row_block_base(*p.it, p.h);
  p.hb = ws.heavy_bits + base;
  p.sb = ws.sample_bits + base;
  p.counts = row_compact_counts(ws.compact_counts, pass, gridDim.y * gridDim.z, row, gridDim.x);
  return p;
}

// This thread's words: a run of consecutive ones, so list positions follow token order.
__device__ __forceinline__ void thread_words(const Span& p, uint32_t words_per_block, uint32_t* a,
                                             uint32_t* e) {
  const uint32_t per = words_per_block / kThreads;
  *a = min(p.w1, p.w0 + threadIdx.x * per);
  *e = min(p.w1, *a + per);
}

// Set bits of words [a, e): heavy in the high half, samples (never heavy) in the
// low half, so one scan or sum serves both lists.
__device__ uint64_t bit_counts(const Span& p, uint32_t a, uint32_t e, bool samples) {
  uint64_t n = 0;
  for (uint32_t w = a; w < e; ++w) {
    const uint32_t hw = p.hb[w];
    n += uint64_t{static_cast<uint32_t>(__popc(hw))} << 32;
    if (samples) n += static_cast<uint32_t>(__popc(p.sb[w] & ~hw));
  }
  return n;
}

__global__ void __launch_bounds__(kThreads) write_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, bool samples,
                                                         uint32_t words_per_block, uint32_t pass) {
  stage_begin();
  const Span p = span_here(b, ws, words_per_block, pass);
  if (!p.sparse()) return;
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint64_t before_s;
  uint32_t a, e;
  thread_words(p, words_per_block, &a, &e);
  uint64_t off, block_total;
  Scan(scan_tmp).ExclusiveSum(bit_counts(p, a, e, samples), off, block_total);
  if (threadIdx.x < 32) {
    volatile uint64_t* counts = p.counts;
    if (threadIdx.x == 0) counts[blockIdx.x] = kCountReady | block_total;
    // The counts of the blocks before this one, a lane per block, each waited for.
    uint64_t before = 0;
    for (uint32_t i = threadIdx.x; i < blockIdx.x; i += 32) {
      uint64_t c;
      do c = counts[i];
      while (!(c & kCountReady));
      before += c & ~kCountReady;
    }
    before = warp_sum(before);
    if (threadIdx.x == 0) {
      before_s = before;
      if (blockIdx.x == gridDim.x - 1) {  // the row's list lengths
        const uint64_t sum = before + block_total;
        p.st->n_heavy = min(static_cast<uint32_t>(sum >> 32), p.it->select_cap);
        if (samples) p.st->n_unique = min(static_cast<uint32_t>(sum), p.it->select_cap);
      }
    }
  }
  __syncthreads();
  off += before_s;
  const DecodeItem& it = *p.it;
  const size_t sel = it.select_base + size_t{p.h} * it.select_cap;
  uint32_t* heavy = ws.heavy + sel;
  uint32_t* sampled = ws.uniq_sorted + sel;
  uint32_t oh = static_cast<uint32_t>(off >> 32), os = static_cast<uint32_t>(off);
  // Token indices first, four words (128 candidates) at a time, the words' loads
  // issued before they are used.
  for (uint32_t c = a; c < e; c += 4) {
    uint32_t hw[4], sw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      hw[u] = c + u < e ? p.hb[c + u] : 0u;
      sw[u] = samples && c + u < e ? p.sb[c + u] : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      sw[u] &= ~hw[u];
      for (; hw[u]; hw[u] &= hw[u] - 1, ++oh) {
        if (oh < it.select_cap) heavy[oh] = it.sink_end + (c + u) * 32 + __ffs(hw[u]) - 1;
      }
      for (; sw[u]; sw[u] &= sw[u] - 1, ++os) {
        if (os < it.select_cap) sampled[os] = it.sink_end + (c + u) * 32 + __ffs(sw[u]) - 1;
      }
    }
  }
  if (!samples) return;
  // Then each sample's log pi, one sample per thread over the block's part of the
  // list: samples crowd where the scores are high, so the few threads whose words
  // hold most of them would otherwise serialise the double math of them all.
  // The sampler's exact probability: the fixed-point weight over the total.
  __syncthreads();  // this block's token indices are written
  const uint32_t s_begin = min(static_cast<uint32_t>(before_s), it.select_cap);
  const uint32_t s_end = min(static_cast<uint32_t>(before_s + block_total), it.select_cap);
  const float* s = ws.scores + row_token_base(it, p.h);
  const float mx = key_float(p.st->max_key);
  const bool uniform = b.sampling == Sampling::kUniform;
  const double m = static_cast<double>(p.st->n_draws), w_total = p.st->w_total;
  float* log_pi = ws.log_pi + sel;
  for (uint32_t i = s_begin + threadIdx.x; i < s_end; i += kThreads) {
    const float sv = uniform ? 0.f : s[sampled[i]];
    const double pj = static_cast<double>(cand_weight(sv, mx, uniform).fixed) / w_total;
    log_pi[i] = static_cast<float>(log(inclusion_probability(pj, m, static_cast<double>(b.pi_min))));
  }
}

}  // namespace

uint32_t compact_words_per_block(uint32_t n_pad_max, uint32_t rows, int sm_count) {
  // One word a thread while that keeps the whole grid within about four blocks per
  // multiprocessor (short rows: more blocks keep the per-thread chains short, a
  // sample's log pi being double math), up to four words a thread (long rows: one
  // word a thread would make so many blocks that their look-back chain dominates).
  const uint32_t words = (n_pad_max + 31) / 32;
  const uint64_t budget = 4ull * static_cast<uint64_t>(sm_count > 0 ? sm_count : 1);
  uint32_t wpb = kThreads;
  while (wpb < 4 * kThreads && uint64_t{rows} * ((words + wpb - 1) / wpb) > budget) wpb *= 2;
  while ((words + wpb - 1) / wpb > kMaxCompactBlocks) wpb *= 2;
  return wpb;
}

cudaError_t launch_compact(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                           bool samples, uint32_t pass, cudaStream_t st) {
  if (pass >= plan.compact_passes) return cudaErrorInvalidValue;
  const dim3 grid(plan.compact_blocks, b.sel_heads(), b.n_items);
  return launch_stage(b, write_kernel, grid, kThreads, 0, st, b, ws, samples, plan.compact_words, pass);
}

}  // namespace ssa::cuda
