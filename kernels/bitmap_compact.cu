// Bitmaps of the selection -> the lists the attention kernel reads, in token order
// (the attention's floating-point order is then fixed). Two kernels over the
// bitmap words of every row, many blocks per row: one counts the set bits of its
// words, the next adds up the counts of the blocks before it, scans its own and
// writes. With samples it also computes each sample's log inclusion probability,
//   p = w / W_R, pi = 1 - (1 - p)^m (common/inclusion_probability.h),
// from the sample's own proxy weight, and the row's heavy mass (statistics).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/inclusion_probability.h"
#include "device_util.cuh"
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
  uint64_t* counts;  // per block of this row: heavy bits << 32 | sample bits
  __device__ bool sparse() const { return it->sink_end < it->local_begin && it->n_select > 0; }
};

__device__ Span span_here(const DecodeBatch& b, const Workspace& ws, uint32_t words_per_block) {
  Span p;
  p.it = &b.items[blockIdx.z];
  p.h = blockIdx.y;
  const uint32_t row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  p.st = &ws.rows[row];
  p.nc = p.it->local_begin - p.it->sink_end;
  const uint32_t words = (p.nc + 31) / 32;
  p.w0 = min(words, blockIdx.x * words_per_block);
  p.w1 = min(words, p.w0 + words_per_block);
  const size_t base = row_block_base(*p.it, p.h);
  p.hb = ws.heavy_bits + base;
  p.sb = ws.sample_bits + base;
  p.counts = ws.compact_counts + size_t{row} * gridDim.x;
  return p;
}

// This thread's words: a run of consecutive ones, so list positions follow token order.
__device__ __forceinline__ void thread_words(const Span& p, uint32_t words_per_block, uint32_t* a,
                                             uint32_t* e) {
  const uint32_t per = words_per_block / kThreads;
  *a = min(p.w1, p.w0 + threadIdx.x * per);
  *e = min(p.w1, *a + per);
}

__global__ void __launch_bounds__(kThreads) count_kernel(DecodeBatch b, Workspace ws, bool samples,
                                                         uint32_t words_per_block) {
  const Span p = span_here(b, ws, words_per_block);
  if (!p.sparse()) return;
  uint32_t a, e;
  thread_words(p, words_per_block, &a, &e);
  uint64_t mine = 0;
  for (uint32_t w = a; w < e; ++w) {
    const uint32_t hw = p.hb[w];
    mine += uint64_t{static_cast<uint32_t>(__popc(hw))} << 32;
    if (samples) mine += static_cast<uint32_t>(__popc(p.sb[w] & ~hw));
  }
  using Reduce = cub::BlockReduce<uint64_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const uint64_t total = Reduce(tmp).Sum(mine);
  if (threadIdx.x == 0) {
    p.counts[blockIdx.x] = total;
    if (blockIdx.x == 0) p.st->w_heavy = 0.0;
  }
}

__global__ void __launch_bounds__(kThreads) write_kernel(DecodeBatch b, Workspace ws, bool samples,
                                                         uint32_t words_per_block) {
  const Span p = span_here(b, ws, words_per_block);
  if (!p.sparse()) return;
  using Reduce = cub::BlockReduce<uint64_t, kThreads>;
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  using DReduce = cub::BlockReduce<double, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
    typename DReduce::TempStorage dreduce;
  } tmp;
  __shared__ uint64_t before_s;
  // Block 0 also totals the row (list lengths); the others need only their offset.
  const uint32_t upto = blockIdx.x == 0 ? gridDim.x : blockIdx.x;
  uint64_t part = 0;
  for (uint32_t i = threadIdx.x; i < upto; i += kThreads) {
    if (blockIdx.x == 0 || i < blockIdx.x) part += p.counts[i];
  }
  const uint64_t sum = Reduce(tmp.reduce).Sum(part);
  if (threadIdx.x == 0) {
    before_s = blockIdx.x == 0 ? 0 : sum;
    if (blockIdx.x == 0) {
      p.st->n_heavy = min(static_cast<uint32_t>(sum >> 32), p.it->select_cap);
      if (samples) p.st->n_unique = min(static_cast<uint32_t>(sum), p.it->select_cap);
    }
  }
  __syncthreads();
  uint32_t a, e;
  thread_words(p, words_per_block, &a, &e);
  uint64_t mine = 0;
  for (uint32_t w = a; w < e; ++w) {
    const uint32_t hw = p.hb[w];
    mine += uint64_t{static_cast<uint32_t>(__popc(hw))} << 32;
    if (samples) mine += static_cast<uint32_t>(__popc(p.sb[w] & ~hw));
  }
  uint64_t off;
  Scan(tmp.scan).ExclusiveSum(mine, off);
  off += before_s;
  const DecodeItem& it = *p.it;
  const size_t sel = it.select_base + size_t{p.h} * it.select_cap;
  uint32_t* heavy = ws.heavy + sel;
  uint32_t* sampled = ws.uniq_sorted + sel;
  float* log_pi = ws.log_pi + sel;
  const float* s = ws.scores + it.score_base + size_t{p.h} * it.n_pad + it.sink_end;
  const float mx = key_float(p.st->max_key);
  const bool uniform = b.sampling == Sampling::kUniform;
  const double m = static_cast<double>(p.st->n_draws), w_total = p.st->w_total;
  uint32_t oh = static_cast<uint32_t>(off >> 32), os = static_cast<uint32_t>(off);
  double w_heavy = 0.0;
  for (uint32_t w = a; w < e; ++w) {
    uint32_t hw = p.hb[w];
    uint32_t sw = samples ? p.sb[w] & ~hw : 0u;
    while (hw) {
      const uint32_t j = w * 32 + __ffs(hw) - 1;
      hw &= hw - 1;
      if (oh < it.select_cap) heavy[oh] = it.sink_end + j;
      ++oh;
      w_heavy += static_cast<double>(expf(s[j] - mx));
    }
    while (sw) {
      const uint32_t j = w * 32 + __ffs(sw) - 1;
      sw &= sw - 1;
      if (os < it.select_cap) {
        sampled[os] = it.sink_end + j;
        const double pj = (uniform ? 1.0 : static_cast<double>(expf(s[j] - mx))) / w_total;
        log_pi[os] = static_cast<float>(log(inclusion_probability(pj, m, static_cast<double>(b.pi_min))));
      }
      ++os;
    }
  }
  __syncthreads();
  const double wh = DReduce(tmp.dreduce).Sum(w_heavy);
  // Statistics only: the order of these additions across blocks is not fixed.
  if (threadIdx.x == 0 && wh != 0.0) atomicAdd(&p.st->w_heavy, wh);
}

}  // namespace

uint32_t compact_words_per_block(uint32_t n_pad_max) {
  const uint32_t words = (n_pad_max + 31) / 32;
  uint32_t wpb = 4 * kThreads;  // 4 words a thread
  while ((words + wpb - 1) / wpb > kMaxCompactBlocks) wpb *= 2;
  return wpb;
}

cudaError_t launch_compact(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                           bool samples, cudaStream_t st) {
  const dim3 grid(plan.compact_blocks, b.shape.n_q_heads, b.n_items);
  count_kernel<<<grid, kThreads, 0, st>>>(b, ws, samples, plan.compact_words);
  write_kernel<<<grid, kThreads, 0, st>>>(b, ws, samples, plan.compact_words);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
