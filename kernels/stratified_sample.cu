// Sampling of the residual R = C \ H (SSA_SPEC.md steps 1-2 on the GPU).
//  1. Heavy tokens are masked out of the scores (their weight becomes 0).
//  2. Residual weights w_i = exp(s~_i - max) (or 1 for uniform sampling) are summed
//     per 32-token block and per 1024-token chunk; chunk sums get a prefix scan.
//  3. Each of the m draws of a row is one thread: Philox draw j of the stream
//     (seed, step, layer, q head) gives three uniforms that pick a chunk (binary
//     search of the prefix), a block within it and a token within the block, with
//     the shared functions of common/sampling_hierarchy.h. The step can be read
//     from device memory so that a captured graph replays with a new step.
//  4. A per-row open-addressing hash table deduplicates the draws; the unique
//     tokens are then sorted by index so that the read set (and so the floating
//     point order of the attention) does not depend on thread timing.
// pi of a unique token is recomputed from its own score in the attention kernel.
// The adaptive heavy set (lambda water-filling) is decided here as well.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common/inclusion_probability.h"
#include "common/philox.h"
#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "device_util.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr uint32_t kEmpty = 0xffffffffu;

struct RowRef {
  const DecodeItem* it;
  uint32_t h, row;
};

__device__ RowRef row_ref(const DecodeBatch& b) {
  RowRef r;
  r.it = &b.items[blockIdx.z];
  r.h = blockIdx.y;
  r.row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  return r;
}

__device__ __forceinline__ float* row_scores(const Workspace& ws, const RowRef& r) {
  return ws.scores + r.it->score_base + size_t{r.h} * r.it->n_pad;
}
__device__ __forceinline__ size_t row_select(const RowRef& r) {
  return r.it->select_base + size_t{r.h} * r.it->select_cap;
}

__global__ void mask_heavy_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  double w = 0.0;
  if (i < st.n_heavy) {
    float* s = row_scores(ws, r);
    const uint32_t t = ws.heavy[row_select(r) + i];
    w = static_cast<double>(expf(s[t] - key_float(st.max_key)));
    s[t] = -INFINITY;
  }
  w = warp_sum(w);
  if ((threadIdx.x & 31) == 0 && w != 0.0) atomicAdd(&ws.rows[r.row].w_heavy, w);
}

// Residual weight of candidate j of a row (token sink_end + j), as the CPU
// backend computes it: float expf(s~ - max), or 1 when sampling uniformly.
__device__ __forceinline__ float residual_weight(float s, float mx, bool uniform) {
  if (s == -INFINITY) return 0.f;
  return uniform ? 1.0f : expf(s - mx);
}

__device__ __forceinline__ uint32_t n_candidates(const DecodeItem& it) {
  return it.local_begin - it.sink_end;
}

// The hierarchy runs over candidate offsets j = t - sink_end (chunk c holds
// candidates [1024 c, 1024 c + 1024)), exactly as the CPU sampler cuts it.
// mode 0: residual hierarchy (bsum, csum) + proxy residual mass; mode 1: only the
// candidate total w_all (adaptive heavy set, before masking).
__global__ void __launch_bounds__(1024) hierarchy_kernel(DecodeBatch b, Workspace ws, int mode) {
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  const uint32_t chunk = blockIdx.x;
  const uint32_t nc = n_candidates(it);
  if (it.n_select == 0 || chunk * kChunkTokens >= nc) return;
  const RowState& st = ws.rows[r.row];
  const float mx = key_float(st.max_key);
  const uint32_t j = chunk * kChunkTokens + threadIdx.x;
  const float s = j < nc ? row_scores(ws, r)[it.sink_end + j] : -INFINITY;
  const double pw = residual_weight(s, mx, false);
  const double w = residual_weight(s, mx, b.sampling == Sampling::kUniform);
  __shared__ double part[32], ppart[32];
  const double bw = warp_sum(w), bp = warp_sum(pw);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    part[warp] = bw;
    ppart[warp] = bp;
    if (mode == 0) ws.bsum[(it.score_base / kBlockTokens) + size_t{r.h} * (it.n_pad / kBlockTokens) +
                           chunk * kBlocksPerChunk + warp] = bw;
  }
  __syncthreads();
  if (warp == 0) {
    const double cw = warp_sum(part[lane]);
    const double cp = warp_sum(ppart[lane]);
    if (lane == 0) {
      if (mode == 0) {
        ws.csum[(it.score_base / kChunkTokens) + size_t{r.h} * (it.n_pad / kChunkTokens) + chunk] = cw;
        if (cp != 0.0) atomicAdd(&ws.rows[r.row].w_resid_proxy, cp);
      } else if (cp != 0.0) {
        atomicAdd(&ws.rows[r.row].w_all, cp);
      }
    }
  }
}

__global__ void __launch_bounds__(1024) chunk_prefix_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  if (it.n_select == 0) return;
  using Scan = cub::BlockScan<double, 1024>;
  __shared__ typename Scan::TempStorage tmp;
  const uint32_t n = (n_candidates(it) + kChunkTokens - 1) / kChunkTokens;
  const size_t base = (it.score_base / kChunkTokens) + size_t{r.h} * (it.n_pad / kChunkTokens);
  double carry = 0.0;
  for (uint32_t c0 = 0; c0 < n; c0 += 1024) {
    const uint32_t c = c0 + threadIdx.x;
    const double v = c < n ? ws.csum[base + c] : 0.0;
    double incl, total;
    Scan(tmp).InclusiveSum(v, incl, total);
    if (c < n) ws.cprefix[base + c] = carry + incl;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) ws.rows[r.row].w_total = carry;
}

__global__ void sample_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  RowState& st = ws.rows[r.row];
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= st.n_draws || !(st.w_total > 0.0)) return;
  const uint64_t step = b.step_dev ? *b.step_dev : b.step;
  const RngStream stream = make_rng_stream(b.seed, step, b.layer, r.h);
  const Philox4 v = rng_draw(stream, j);
  const uint32_t nc = n_candidates(it);
  const uint32_t n_chunks = (nc + kChunkTokens - 1) / kChunkTokens;
  const size_t cbase = (it.score_base / kChunkTokens) + size_t{r.h} * (it.n_pad / kChunkTokens);
  const size_t bbase = (it.score_base / kBlockTokens) + size_t{r.h} * (it.n_pad / kBlockTokens);
  const uint32_t chunk = pick_from_prefix(ws.cprefix + cbase, n_chunks, rng_uniform(v.v[0]) * st.w_total);
  const double* bs = ws.bsum + bbase + size_t{chunk} * kBlocksPerChunk;
  const uint32_t blk = chunk * kBlocksPerChunk +
                       pick_by_scan(bs, kBlocksPerChunk, rng_uniform(v.v[1]) * ws.csum[cbase + chunk]);
  // Candidate within the block: pick_by_scan over weights computed on the fly.
  const double target = rng_uniform(v.v[2]) * ws.bsum[bbase + blk];
  const float* s = row_scores(ws, r) + it.sink_end + size_t{blk} * kBlockTokens;
  const float mx = key_float(st.max_key);
  const bool uniform = b.sampling == Sampling::kUniform;
  double run = 0.0;
  uint32_t pick = 0, last_positive = 0;
  bool found = false;
  for (uint32_t i = 0; i < kBlockTokens; ++i) {
    if (blk * kBlockTokens + i >= nc) break;
    const float w = residual_weight(s[i], mx, uniform);
    if (w > 0) {
      run += static_cast<double>(w);
      last_positive = i;
      if (run > target) {
        pick = i;
        found = true;
        break;
      }
    }
  }
  if (!found) pick = last_positive;
  const uint32_t token = it.sink_end + blk * kBlockTokens + pick;
  // Insert into the row's hash table; the first inserter appends the token.
  uint32_t* table = ws.hash + it.hash_base + size_t{r.h} * it.hash_cap;
  const uint32_t mask = it.hash_cap - 1;
  uint32_t slot = (token * 0x9E3779B1u) & mask;
  for (;;) {
    const uint32_t prev = atomicCAS(&table[slot], kEmpty, token);
    if (prev == kEmpty) {
      const uint32_t pos = atomicAdd(&st.n_unique, 1u);
      ws.uniq[row_select(r) + pos] = token;
      break;
    }
    if (prev == token) break;
    slot = (slot + 1) & mask;
  }
}

// pi of each unique sample, recomputed from its own proxy weight:
// p = w / W_R, pi = 1 - (1 - p)^m (common/inclusion_probability.h), as log(pi).
__global__ void log_pi_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.n_unique) return;
  const size_t base = row_select(r);
  const uint32_t t = ws.uniq_sorted[base + i];
  const float w = residual_weight(row_scores(ws, r)[t], key_float(st.max_key),
                                  b.sampling == Sampling::kUniform);
  const double p = static_cast<double>(w) / st.w_total;
  ws.log_pi[base + i] = static_cast<float>(
      log(inclusion_probability(p, static_cast<double>(st.n_draws), static_cast<double>(b.pi_min))));
}

__global__ void segments_kernel(DecodeBatch b, Workspace ws, int which) {
  const uint32_t item = blockIdx.x, h = threadIdx.x;
  if (h >= b.shape.n_q_heads) return;
  const DecodeItem& it = b.items[item];
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  const size_t base = it.select_base + size_t{h} * it.select_cap;
  const uint32_t n = which == 0 ? ws.rows[row].n_unique : ws.rows[row].topk_k;
  ws.seg_begin[row] = static_cast<int>(base);
  ws.seg_end[row] = static_cast<int>(base + n);
}

// Adaptive: score keys of the k' top candidates, for a descending segmented sort.
__global__ void candidate_keys_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ws.rows[r.row].topk_k) return;
  const size_t base = row_select(r);
  ws.sort_keys[base + i] = float_key(row_scores(ws, r)[ws.heavy[base + i]]);
}

__global__ void candidate_probs_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.topk_k) return;
  const size_t base = row_select(r);
  const float w = expf(key_float(ws.sort_keys2[base + i]) - key_float(st.max_key));
  ws.probs[base + i] = static_cast<double>(w) / st.w_all;
}

__global__ void water_fill_kernel(DecodeBatch b, Workspace ws) {
  const uint32_t item = blockIdx.x, h = threadIdx.x;
  if (h >= b.shape.n_q_heads) return;
  const DecodeItem& it = b.items[item];
  if (it.n_select == 0) return;
  RowState& st = ws.rows[row_of(item, h, b.shape.n_q_heads)];
  const size_t base = it.select_base + size_t{h} * it.select_cap;
  const WaterFill wf = water_fill(ws.probs + base, st.topk_k, 1.0, static_cast<double>(it.n_select));
  st.n_heavy = static_cast<uint32_t>(wf.heavy);
  st.n_draws = b.sampling == Sampling::kNone ? 0u : it.n_select - st.n_heavy;
}

__global__ void take_heavy_kernel(DecodeBatch b, Workspace ws) {
  const RowRef r = row_ref(b);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ws.rows[r.row].n_heavy) return;
  const size_t base = row_select(r);
  ws.heavy[base + i] = ws.sort_vals2[base + i];
}

cudaError_t hierarchy(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                      int mode, cudaStream_t st) {
  const dim3 grid(plan.n_pad_max / kChunkTokens, b.shape.n_q_heads, b.n_items);
  hierarchy_kernel<<<grid, 1024, 0, st>>>(b, ws, mode);
  return cudaGetLastError();
}

}  // namespace

size_t segmented_sort_temp_bytes(uint32_t rows, uint64_t entries) {
  size_t a = 0, c = 0;
  int n = static_cast<int>(entries);
  cub::DeviceSegmentedRadixSort::SortKeys(nullptr, a, static_cast<const uint32_t*>(nullptr),
                                          static_cast<uint32_t*>(nullptr), n, static_cast<int>(rows),
                                          static_cast<const int*>(nullptr),
                                          static_cast<const int*>(nullptr));
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, c, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n,
      static_cast<int>(rows), static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  return a > c ? a : c;
}

cudaError_t launch_adaptive_heavy(const DecodeBatch& b, const WorkspacePlan& plan,
                                  const Workspace& ws, cudaStream_t st) {
  cudaError_t e;
  if ((e = hierarchy(b, plan, ws, 1, st)) != cudaSuccess) return e;
  const dim3 grid((plan.select_cap_max + 255) / 256, b.shape.n_q_heads, b.n_items);
  const uint32_t hb = (b.shape.n_q_heads + 31) / 32 * 32;
  candidate_keys_kernel<<<grid, 256, 0, st>>>(b, ws);
  segments_kernel<<<b.n_items, hb, 0, st>>>(b, ws, 1);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  size_t bytes = ws.sort_temp_bytes;
  e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      ws.sort_temp, bytes, ws.sort_keys, ws.sort_keys2, ws.heavy, ws.sort_vals2,
      static_cast<int>(plan.select_entries), static_cast<int>(plan.rows), ws.seg_begin, ws.seg_end,
      0, 32, st);
  if (e != cudaSuccess) return e;
  candidate_probs_kernel<<<grid, 256, 0, st>>>(b, ws);
  water_fill_kernel<<<b.n_items, hb, 0, st>>>(b, ws);
  take_heavy_kernel<<<grid, 256, 0, st>>>(b, ws);
  return cudaGetLastError();
}

cudaError_t launch_sampling(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t st) {
  cudaError_t e;
  if (b.sampling == Sampling::kNone) return cudaSuccess;
  const dim3 grid((plan.select_cap_max + 255) / 256, b.shape.n_q_heads, b.n_items);
  mask_heavy_kernel<<<grid, 256, 0, st>>>(b, ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  if ((e = hierarchy(b, plan, ws, 0, st)) != cudaSuccess) return e;
  chunk_prefix_kernel<<<dim3(1, b.shape.n_q_heads, b.n_items), 1024, 0, st>>>(b, ws);
  if ((e = cudaMemsetAsync(ws.hash, 0xff, plan.hash_entries * sizeof(uint32_t), st)) != cudaSuccess)
    return e;
  sample_kernel<<<grid, 256, 0, st>>>(b, ws);
  segments_kernel<<<b.n_items, (b.shape.n_q_heads + 31) / 32 * 32, 0, st>>>(b, ws, 0);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  uint32_t bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) < plan.n_pad_max) ++bits;
  size_t bytes = ws.sort_temp_bytes;
  e = cub::DeviceSegmentedRadixSort::SortKeys(ws.sort_temp, bytes, ws.uniq, ws.uniq_sorted,
                                              static_cast<int>(plan.select_entries),
                                              static_cast<int>(plan.rows), ws.seg_begin, ws.seg_end, 0,
                                              static_cast<int>(bits), st);
  if (e != cudaSuccess) return e;
  log_pi_kernel<<<grid, 256, 0, st>>>(b, ws);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
