// Sampling of the residual R = C \ H (SSA_SPEC.md steps 1-2 on the GPU).
//  1. Residual weights w_i = exp(s~_i - max) (or 1 for uniform sampling), 0 for
//     the tokens of the heavy bitmap, in fixed point (cand_weight, device_util.cuh),
//     are summed per 32-token block and per 1024-token chunk: by the top-k filter
//     (kernels/topk_select.cu) for the fixed heavy rule, by hierarchy_kernel
//     below for the adaptive one. Chunk sums get a prefix scan.
//  2. Each of the m draws of a row is one thread: Philox draw j of the stream
//     (seed, step, layer, q head) gives three uniforms that pick a chunk (binary
//     search of the prefix), a block within it and a token within the block, with
//     the shared functions of common/sampling_hierarchy.h. The step can be read
//     from device memory so that a captured graph replays with a new step.
//  3. A draw sets its token's bit in the sample bitmap: repeated draws of a token
//     leave one bit, and kernels/bitmap_compact.cu lists the unique samples in
//     token order with their log pi, so nothing depends on thread timing.
// The adaptive heavy set (lambda water-filling) is decided here as well.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common/philox.h"
#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "device_util.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

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
  return ws.scores + row_token_base(*r.it, r.h);
}
__device__ __forceinline__ size_t row_select(const RowRef& r) {
  return r.it->select_base + size_t{r.h} * r.it->select_cap;
}

__device__ __forceinline__ uint32_t n_candidates(const DecodeItem& it) {
  return it.local_begin - it.sink_end;
}

// The hierarchy runs over candidate offsets j = t - sink_end (chunk c holds
// candidates [1024 c, 1024 c + 1024)), exactly as the CPU sampler cuts it. One
// warp per chunk: it reads the chunk's scores coalesced into shared memory, then
// each lane sums one 32-candidate block in order (no shuffles per block), and one
// warp sum gives the chunk.
// mode 0 (adaptive heavy rule, after the heavy set is final): residual hierarchy
// (bsum, csum) + proxy residual and heavy masses, and the sample bitmap cleared;
// mode 1: only the candidate total w_all (adaptive heavy set, all candidates).
constexpr int kChunksPerBlock = 8;

__global__ void __launch_bounds__(32 * kChunksPerBlock) hierarchy_kernel(DecodeBatch b, Workspace ws,
                                                                         int mode) {
  stage_begin();
  __shared__ ChunkTile tile_s[kChunksPerBlock];
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t chunk = blockIdx.x * kChunksPerBlock + warp;
  const uint32_t nc = n_candidates(it);
  if (it.n_select == 0 || chunk * kChunkTokens >= nc) return;  // whole warps leave
  const RowState& st = ws.rows[r.row];
  const float mx = key_float(st.max_key);
  const float* cs = row_scores(ws, r) + it.sink_end + size_t{chunk} * kChunkTokens;
  const uint32_t n_here = min(kChunkTokens, nc - chunk * kChunkTokens);
  ChunkTile& tile = tile_s[warp];
  load_chunk_tile(tile, cs, n_here, lane);
  const uint32_t blk_in_row = chunk * kBlocksPerChunk + lane;
  const size_t blk = row_block_base(it, r.h) + blk_in_row;
  const uint32_t heavy = mode == 0 && lane * kBlockTokens < n_here ? ws.heavy_bits[blk] : 0u;  // mode 1: none
  const bool uniform = b.sampling == Sampling::kUniform;
  // One exponential per candidate, shared by the three sums.
  uint64_t w = 0;
  double pw = 0.0, hw = 0.0;
#pragma unroll 8
  for (uint32_t i = 0; i < kBlockTokens; ++i) {
    const CandWeight wt = cand_weight(tile[lane][i], mx, uniform);
    if ((heavy >> i) & 1u) {
      hw += static_cast<double>(wt.e);
    } else {
      pw += static_cast<double>(wt.e);
      w += wt.fixed;
    }
  }
  if (mode == 0) {  // also the empty blocks at the end of the last chunk: 0
    ws.bsum[blk] = w;
    ws.sample_bits[blk] = 0u;
  }
  const uint64_t cw = warp_sum(w);
  const double cp = warp_sum(pw), ch = mode == 0 ? warp_sum(hw) : 0.0;
  if (lane == 0) {
    if (mode == 0) {
      ws.csum[row_chunk_base(it, r.h) + chunk] = cw;
      // Statistics only (the order of these additions is not fixed).
      if (cp != 0.0) atomicAdd(&ws.rows[r.row].w_resid_proxy, cp);
      if (ch != 0.0) atomicAdd(&ws.rows[r.row].w_heavy, ch);
    } else if (cp != 0.0) {
      atomicAdd(&ws.rows[r.row].w_all, cp);
    }
  }
}

// Chunk prefix sums for rows too long for the sampler's shared memory (see below).
__global__ void __launch_bounds__(1024) chunk_prefix_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  if (it.n_select == 0) return;
  using Scan = cub::BlockScan<uint64_t, 1024>;
  __shared__ typename Scan::TempStorage tmp;
  const uint32_t n = (n_candidates(it) + kChunkTokens - 1) / kChunkTokens;
  const size_t base = row_chunk_base(it, r.h);
  uint64_t carry = 0;
  for (uint32_t c0 = 0; c0 < n; c0 += 1024) {
    const uint32_t c = c0 + threadIdx.x;
    const uint64_t v = c < n ? ws.csum[base + c] : 0;
    uint64_t incl, total;
    Scan(tmp).InclusiveSum(v, incl, total);
    if (c < n) ws.cprefix[base + c] = carry + incl;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) ws.rows[r.row].w_total = static_cast<double>(carry);
}

constexpr uint32_t kSampleThreads = 256;
constexpr uint32_t kPrefixSmem = 4096;  // rows of up to 4M candidates: chunk prefixes in shared memory
constexpr uint32_t kPrefixPerThread = kPrefixSmem / kSampleThreads;

// Every block of a row first builds the row's chunk prefix sums in shared memory
// (a few KB from L2, the same deterministic order in every block, no separate
// kernel), so the binary search per draw reads shared memory; block 0 records the
// total. Longer rows use the prefixes of chunk_prefix_kernel from global memory.
__global__ void __launch_bounds__(kSampleThreads) sample_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  __shared__ uint64_t prefix_s[kPrefixSmem];
  __shared__ uint64_t total_s;
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  RowState& st = ws.rows[r.row];
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (it.n_select == 0 || blockIdx.x * blockDim.x >= st.n_draws) return;  // whole block
  const uint32_t nc = n_candidates(it);
  const uint32_t n_chunks = (nc + kChunkTokens - 1) / kChunkTokens;
  const size_t cbase = row_chunk_base(it, r.h);
  const size_t bbase = row_block_base(it, r.h);
  const uint64_t* prefix = ws.cprefix + cbase;
  uint64_t w_total;
  if (n_chunks <= kPrefixSmem) {
    using Scan = cub::BlockScan<uint64_t, kSampleThreads>;
    __shared__ typename Scan::TempStorage tmp;
    const uint32_t c0 = threadIdx.x * kPrefixPerThread;
    uint64_t v[kPrefixPerThread], sum = 0;
#pragma unroll
    for (uint32_t i = 0; i < kPrefixPerThread; ++i) {
      v[i] = c0 + i < n_chunks ? ws.csum[cbase + c0 + i] : 0;
      sum += v[i];
    }
    uint64_t run, total;
    Scan(tmp).ExclusiveSum(sum, run, total);
#pragma unroll
    for (uint32_t i = 0; i < kPrefixPerThread; ++i) {
      run += v[i];
      prefix_s[c0 + i] = run;
    }
    if (threadIdx.x == 0) {
      total_s = total;
      if (blockIdx.x == 0) st.w_total = static_cast<double>(total);
    }
    __syncthreads();
    prefix = prefix_s;
    w_total = total_s;
  } else {
    w_total = prefix[n_chunks - 1];
  }
  if (j >= st.n_draws || w_total == 0) return;
  const uint64_t step = b.step_dev ? *b.step_dev : b.step;
  const RngStream stream = make_rng_stream(b.seed, step, b.layer, r.h);
  const Philox4 v = rng_draw(stream, j);
  // Integer targets u * total (a rounding up to the total itself picks the last
  // weighted entry, as on the CPU).
  auto target = [](uint32_t bits, uint64_t total) {
    return static_cast<uint64_t>(rng_uniform(bits) * static_cast<double>(total));
  };
  const uint32_t chunk = pick_from_prefix(prefix, n_chunks, target(v.v[0], w_total));
  // The 32 block sums of the chunk and then the 32 scores of the block: all loads
  // issued before the scans (independent, in flight together).
  uint64_t bs[kBlocksPerChunk];
  const ulonglong2* bs2 =
      reinterpret_cast<const ulonglong2*>(ws.bsum + bbase + size_t{chunk} * kBlocksPerChunk);
#pragma unroll
  for (uint32_t i = 0; i < kBlocksPerChunk / 2; ++i) {
    const ulonglong2 d = bs2[i];
    bs[2 * i] = d.x;
    bs[2 * i + 1] = d.y;
  }
  const uint32_t in_chunk =
      pick_by_scan(bs, kBlocksPerChunk, target(v.v[1], ws.csum[cbase + chunk]));
  const uint32_t blk = chunk * kBlocksPerChunk + in_chunk;
  uint64_t block_w = 0;  // bs[in_chunk], without a dynamic index (bs stays in registers)
#pragma unroll
  for (uint32_t i = 0; i < kBlocksPerChunk; ++i) block_w = i == in_chunk ? bs[i] : block_w;
  // Candidate within the block: pick_by_scan over weights computed on the fly.
  const uint64_t in_block = target(v.v[2], block_w);
  const float* s = row_scores(ws, r) + it.sink_end + size_t{blk} * kBlockTokens;
  const float mx = key_float(st.max_key);
  const bool uniform = b.sampling == Sampling::kUniform;
  const uint32_t heavy = ws.heavy_bits[bbase + blk];
  const uint32_t n = min(kBlockTokens, nc - blk * kBlockTokens);
  // The block's 32 scores as 16-byte loads from the aligned address at or below
  // (row starts are 16-byte aligned). Past the last candidate the loads may run
  // into the next row or the buffer after the scores, inside the workspace; those
  // values are masked.
  const uint32_t o = static_cast<uint32_t>((reinterpret_cast<uintptr_t>(s) >> 2) & 3u);
  const float4* a4 = reinterpret_cast<const float4*>(s - o);
  float raw[kBlockTokens + 4];
#pragma unroll
  for (uint32_t i = 0; i < kBlockTokens / 4; ++i) {
    const float4 q4 = a4[i];
    raw[4 * i] = q4.x; raw[4 * i + 1] = q4.y; raw[4 * i + 2] = q4.z; raw[4 * i + 3] = q4.w;
  }
  {
    const float4 q4 = o + n > kBlockTokens ? a4[kBlockTokens / 4] : make_float4(0.f, 0.f, 0.f, 0.f);
    raw[32] = q4.x; raw[33] = q4.y; raw[34] = q4.z; raw[35] = q4.w;
  }
  float sv[kBlockTokens];
#pragma unroll
  for (uint32_t i = 0; i < kBlockTokens; ++i) {
    const float x = o == 0 ? raw[i] : o == 1 ? raw[i + 1] : o == 2 ? raw[i + 2] : raw[i + 3];
    sv[i] = i < n ? x : -INFINITY;
  }
  uint64_t run = 0;
  uint32_t pick = 0, last_positive = 0;
  bool found = false;
#pragma unroll
  for (uint32_t i = 0; i < kBlockTokens; ++i) {
    const uint64_t w = (heavy >> i) & 1u ? 0 : cand_weight(sv[i], mx, uniform).fixed;
    if (!found && w > 0) {
      run += w;
      last_positive = i;
      if (run > in_block) {
        pick = i;
        found = true;
      }
    }
  }
  if (!found) pick = last_positive;
  atomicOr(&ws.sample_bits[bbase + blk], 1u << pick);
}

__global__ void segments_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  const uint32_t item = blockIdx.x, h = threadIdx.x;
  if (h >= b.shape.n_q_heads) return;
  const DecodeItem& it = b.items[item];
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  const size_t base = it.select_base + size_t{h} * it.select_cap;
  const uint32_t n = ws.rows[row].topk_k;
  ws.seg_begin[row] = static_cast<int>(base);
  ws.seg_end[row] = static_cast<int>(base + n);
}

// Adaptive: score keys of the k' top candidates, for a descending segmented sort.
__global__ void candidate_keys_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ws.rows[r.row].topk_k) return;
  const size_t base = row_select(r);
  ws.sort_keys[base + i] = float_key(row_scores(ws, r)[ws.heavy[base + i]]);
}

__global__ void candidate_probs_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.topk_k) return;
  const size_t base = row_select(r);
  const float w = expf(key_float(ws.sort_keys2[base + i]) - key_float(st.max_key));
  ws.probs[base + i] = static_cast<double>(w) / st.w_all;
}

__global__ void water_fill_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
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

// The top-k' candidates past the first n_heavy (by score) leave the heavy bitmap.
__global__ void drop_light_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  const RowRef r = row_ref(b);
  const RowState& st = ws.rows[r.row];
  const uint32_t i = st.n_heavy + blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= st.topk_k) return;
  const uint32_t j = ws.sort_vals2[row_select(r) + i] - r.it->sink_end;
  atomicAnd(&ws.heavy_bits[row_block_base(*r.it, r.h) + (j >> 5)], ~(1u << (j & 31)));
}

cudaError_t hierarchy(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                      int mode, cudaStream_t st) {
  const uint32_t chunks = plan.n_pad_max / kChunkTokens;
  const dim3 grid((chunks + kChunksPerBlock - 1) / kChunksPerBlock, b.shape.n_q_heads, b.n_items);
  return launch_stage(b, hierarchy_kernel, grid, 32 * kChunksPerBlock, 0, st, b, ws, mode);
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
  if ((e = hierarchy(b, plan, ws, 1, st)) != cudaSuccess) return e;
  const dim3 grid((plan.select_cap_max + 255) / 256, b.shape.n_q_heads, b.n_items);
  const uint32_t hb = (b.shape.n_q_heads + 31) / 32 * 32;
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

cudaError_t launch_sampling(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t st) {
  cudaError_t e;
  if (b.sampling == Sampling::kNone) return cudaSuccess;
  // Otherwise the sums came from the top-k filter.
  if (!filter_sums_residual(b) && (e = hierarchy(b, plan, ws, 0, st)) != cudaSuccess) return e;
  if (plan.n_pad_max / kChunkTokens > kPrefixSmem &&
      (e = launch_stage(b, chunk_prefix_kernel, dim3(1, b.shape.n_q_heads, b.n_items), 1024, 0, st, b, ws)) !=
          cudaSuccess)
    return e;
  const dim3 grid((plan.select_cap_max + kSampleThreads - 1) / kSampleThreads, b.shape.n_q_heads,
                  b.n_items);
  return launch_stage(b, sample_kernel, grid, kSampleThreads, 0, st, b, ws);
}

}  // namespace ssa::cuda
