// The device half of a decode step (step_plan.h): one small kernel plans every
// item from its layer's length in device memory, one copies the new token's K
// and V rows into the reserved pages. Both are plain launches, so the decode
// stages after them (launched with programmatic dependent launch, which waits
// for the preceding grid in stage_begin) see everything they wrote.
#include <math.h>

#include "common/sampling_hierarchy.h"
#include "step_plan.h"

namespace ssa::cuda {
namespace {

__device__ __forceinline__ uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

// The CPU planner's arithmetic on n tokens (plan_decode, plan_item, and
// plan_workspace's per-item part), integer for integer: the same double
// division for a sparsity budget and the same round-half-even heavy count.
__device__ void plan_on_device(uint32_t n, const StepRequest& r, bool proxy_none, bool adaptive, DecodeItem* it) {
  const uint64_t N = n;
  const uint64_t sink_end = min64(r.n_sink, N);
  const uint64_t local_begin = max64(sink_end, N - min64(r.n_local, N));
  const uint64_t always = sink_end + (N - local_begin);
  const uint64_t k = r.budget != 0 ? r.budget : static_cast<uint64_t>(ceil(static_cast<double>(N) / static_cast<double>(r.sparsity)));
  const uint64_t kprime = k > always ? k - always : 0;
  const uint64_t candidates = local_begin - sink_end;
  const bool dense = r.method == 0 /* SSA_METHOD_DENSE */ || k >= N || kprime >= candidates;
  // plan_item (method_plan.cc): the selection budget of a row, and a group
  // budget that covers every candidate read densely.
  const uint64_t sel = r.grouped ? kprime * r.group_size : kprime;
  const bool reads_all = dense || (r.grouped && sel >= candidates);
  uint64_t se, lb, n_select = 0, n_heavy = 0;
  if (reads_all || kprime == 0) {
    se = reads_all ? N : sink_end;
    lb = reads_all ? N : local_begin;
  } else {
    se = sink_end;
    lb = local_begin;
    n_select = sel;
    if (!adaptive) {
      switch (r.method) {  // fixed_heavy_count (select/selection.cc)
        case 1: /* ORACLE_TOPK */
        case 2: /* PQ_TOPK */ n_heavy = sel; break;
        case 4: /* SAMPLING */ n_heavy = 0; break;
        default: {
          const double v = rint(static_cast<double>(r.heavy_fraction) * static_cast<double>(sel));
          n_heavy = min64(sel, static_cast<uint64_t>(v < 0 ? 0 : v));
        }
      }
    }
  }
  // plan_workspace: a dense item of the batch reads [0, n) as its fixed range.
  const bool dense_item = proxy_none || se >= lb;
  if (dense_item) {
    se = lb = N;
    n_select = n_heavy = 0;
  }
  it->n_tokens = n;
  it->first_token = 0;
  it->sink_end = static_cast<uint32_t>(se);
  it->local_begin = static_cast<uint32_t>(lb);
  it->n_select = static_cast<uint32_t>(n_select);
  it->n_heavy = static_cast<uint32_t>(n_heavy);
  it->n_pad = dense_item ? kChunkTokens : static_cast<uint32_t>((N + kChunkTokens - 1) / kChunkTokens * kChunkTokens);
  it->select_cap = it->n_select > 1u ? it->n_select : 1u;
}

__global__ void step_plan_kernel(const __grid_constant__ DecodeBatch b, const __grid_constant__ StepBatch sb,
                                 StepPlanOut out) {
  const uint32_t i = threadIdx.x;
  if (i >= sb.n_items) return;
  const StepItem& si = sb.items[i];
  DecodeItem it = b.items[i];  // pointers and workspace bases, planned at capacity
  // The guard first: after the reservation ended nothing else of it may be read.
  const bool live = si.guard->generation == si.generation;
  const uint32_t n_old = live ? *si.length : 0;
  if (!live || n_old >= si.capacity) {
    if (live) atomicAdd(&si.guard->dropped_full, 1u); else atomicAdd(&si.guard->dropped_ended, 1u);
    it.n_tokens = it.first_token = it.sink_end = it.local_begin = 0;  // idle (item_idle)
    it.n_select = it.n_heavy = 0;
    it.n_pad = kChunkTokens;
    it.select_cap = 1;
    out.items[i] = it;
    out.position[i] = kNoPosition;
    out.step[i] = 0;
    return;
  }
  *si.length = n_old + 1;
  plan_on_device(n_old + 1, sb.req, b.proxy == Proxy::kNone, b.heavy == HeavyRule::kAdaptive, &it);
  out.items[i] = it;
  out.position[i] = n_old;
  out.step[i] = sb.req.step + n_old;
}

constexpr uint32_t kRowThreads = 256;

// Grid (items, 2: K then V). The rows of a token are [n_kv][head_dim] in the
// caller's array and one row per head in a page (lib/store/kv_layout.h: K of all
// heads, then V, each head's rows contiguous), copied as 16-bit units (every
// row is a multiple of 16 bytes; the caller's arrays must be 2-byte aligned).
__global__ void __launch_bounds__(kRowThreads) step_rows_kernel(DecodeShape shape, const __grid_constant__ StepBatch sb,
                                                                const uint32_t* position) {
  const uint32_t i = blockIdx.x;
  const uint32_t pos = position[i];
  if (pos == kNoPosition) return;
  const StepItem& si = sb.items[i];
  const bool is_v = blockIdx.y == 1;
  const uint32_t row_units = shape.head_dim * dtype_bytes(shape.dtype) / 2;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(is_v ? si.v : si.k);
  uint8_t* page = si.kv_pages[pos >> shape.page_shift];
  const uint32_t slot = pos & (shape.page_tokens - 1);
  const size_t row_bytes = size_t{row_units} * 2;
  uint8_t* half = page + (is_v ? size_t{shape.page_tokens} * shape.n_kv_heads * row_bytes : 0);
  for (uint32_t u = threadIdx.x; u < shape.n_kv_heads * row_units; u += kRowThreads) {
    const uint32_t h = u / row_units, c = u % row_units;
    reinterpret_cast<uint16_t*>(half + (size_t{h} * shape.page_tokens + slot) * row_bytes)[c] = src[u];
  }
}

}  // namespace

cudaError_t launch_step_plan(const DecodeBatch& b, const StepBatch& sb, StepPlanOut out, cudaStream_t st) {
  if (sb.n_items == 0 || sb.n_items > kMaxBatchItems || sb.n_items != b.n_items) return cudaErrorInvalidValue;
  step_plan_kernel<<<1, 32, 0, st>>>(b, sb, out);
  return cudaGetLastError();
}

cudaError_t launch_step_rows(const DecodeShape& shape, const StepBatch& sb, const uint32_t* position,
                             cudaStream_t st) {
  if (sb.n_items == 0 || sb.n_items > kMaxBatchItems) return cudaErrorInvalidValue;
  step_rows_kernel<<<dim3(sb.n_items, 2), kRowThreads, 0, st>>>(shape, sb, position);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
