// The adaptive heavy set (SSA_METHOD_SSA_ADAPTIVE): the k' top candidates of
// the top-k stage sorted by score, their proxy probabilities over the candidate
// total (launch_hierarchy, mode 1), lambda water-filling (common/water_filling.h)
// over them for |H|, and the candidates past |H| dropped from the heavy bitmap.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common/water_filling.h"
#include "device_util.cuh"
#include "row_ref.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

__global__ void segments_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const uint32_t item = blockIdx.x, h = threadIdx.x;
  if (h >= b.sel_heads()) return;
  const DecodeItem& it = b.item(item);
  const uint32_t row = row_of(item, h, b.sel_heads());
  const size_t base = it.select_base + size_t{h} * it.select_cap;
  const uint32_t n = ws.rows[row].topk_k;
  ws.seg_begin[row] = static_cast<int>(base);
  ws.seg_end[row] = static_cast<int>(base + n);
}

// Adaptive: score keys of the k' top candidates, for a descending segmented sort.
__global__ void candidate_keys_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ws.rows[r.row].topk_k) return;
  const size_t base = row_select(r);
  ws.sort_keys[base + i] = float_key(row_scores(ws, r)[ws.heavy[base + i]]);
}

__global__ void candidate_probs_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.topk_k) return;
  const size_t base = row_select(r);
  const float w = expf(key_float(ws.sort_keys2[base + i]) - key_float(st.max_key));
  ws.probs[base + i] = static_cast<double>(w) / st.w_all;
}

__global__ void water_fill_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const uint32_t item = blockIdx.x, h = threadIdx.x;
  if (h >= b.sel_heads()) return;
  const DecodeItem& it = b.item(item);
  if (it.n_select == 0) return;
  RowState& st = ws.rows[row_of(item, h, b.sel_heads())];
  const size_t base = it.select_base + size_t{h} * it.select_cap;
  const WaterFill wf = water_fill(ws.probs + base, st.topk_k, 1.0, static_cast<double>(it.n_select));
  st.n_heavy = static_cast<uint32_t>(wf.heavy);
  st.n_draws = b.sampling == Sampling::kNone ? 0u : it.n_select - st.n_heavy;
}

// The top-k' candidates past the first n_heavy (by score) leave the heavy bitmap.
__global__ void drop_light_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = st.n_heavy + blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.topk_k) return;
  const uint32_t j = ws.sort_vals2[row_select(r) + i] - r.it->sink_end;
  atomicAnd(&ws.heavy_bits[row_block_base(*r.it, r.h) + (j >> 5)], ~(1u << (j & 31)));
}

}  // namespace

size_t segmented_sort_temp_bytes(uint32_t rows, uint64_t entries) {
  size_t c = 0;
  int n = static_cast<int>(entries);
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, c, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n,
      static_cast<int>(rows), static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  return c;
}

cudaError_t launch_adaptive_heavy(const DecodeBatch& b, const WorkspacePlan& plan,
                                  const Workspace& ws, cudaStream_t st) {
  cudaError_t e;
  if ((e = launch_hierarchy(b, plan, ws, 1, st)) != cudaSuccess) return e;
  const dim3 grid((plan.select_cap_max + 255) / 256, b.sel_heads(), b.n_items);
  const uint32_t hb = (b.sel_heads() + 31) / 32 * 32;
  if ((e = launch_stage(b, candidate_keys_kernel, grid, 256, 0, st, b, ws)) != cudaSuccess) return e;
  if ((e = launch_stage(b, segments_kernel, b.n_items, hb, 0, st, b, ws)) != cudaSuccess) return e;
  size_t bytes = ws.sort_temp_bytes;
  e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      ws.sort_temp, bytes, ws.sort_keys, ws.sort_keys2, ws.heavy, ws.sort_vals2,
      static_cast<int>(plan.select_entries), static_cast<int>(plan.rows), ws.seg_begin, ws.seg_end,
      0, 32, st);
  if (e != cudaSuccess) return e;
  if ((e = launch_stage(b, candidate_probs_kernel, grid, 256, 0, st, b, ws)) != cudaSuccess) return e;
  if ((e = launch_stage(b, water_fill_kernel, b.n_items, hb, 0, st, b, ws)) != cudaSuccess) return e;
  return launch_stage(b, drop_light_kernel, grid, 256, 0, st, b, ws);
}

}  // namespace ssa::cuda
