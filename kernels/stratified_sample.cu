// Sampling of the residual R = C \ H (docs/ALGORITHM.md #stratification, #inclusion-probability, #sampling-hierarchy, on the GPU).
//  1. Residual weights w_i = exp(s~_i - max) (or 1 for uniform sampling), 0 for
//     the tokens of the heavy bitmap, in fixed point (cand_weight, device_util.cuh),
//     are summed per 32-token block and per 1024-token chunk: by the top-k filter
//     (kernels/topk_select.cu) for the fixed heavy rule, by hierarchy_kernel
//     below for the adaptive one. Chunk sums get a prefix scan.
//  2. Draw j of a row is Philox draw j of the stream (seed, step, layer, q head;
//     with group selection the group's first q head, DecodeBatch::rng_head):
//     three uniforms that pick a chunk (one thread, binary search of the prefix),
//     a block within it and a token within the block (a group of four lanes, each
//     holding a quarter of the block sums, then of the scores), by the rules of
//     common/sampling_hierarchy.h over the same integers. The step can be read
//     from device memory so that a captured graph replays with a new step.
//     An error-targeted decode also lists each draw's token in draw order
//     (record_draws): its error estimate needs the draws with multiplicity.
//  3. A draw sets its token's bit in the sample bitmap: repeated draws of a token
//     leave one bit, and kernels/bitmap_compact.cu lists the unique samples in
//     token order with their log pi, so nothing depends on thread timing.
// The hierarchy of mode 1 also gives the adaptive heavy set its candidate total
// (adaptive_heavy.cu).
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "common/philox.h"
#include "common/sampling_hierarchy.h"
#include "device_util.cuh"
#include "row_ref.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

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

__global__ void __launch_bounds__(32 * kChunksPerBlock) hierarchy_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
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
__global__ void __launch_bounds__(1024) chunk_prefix_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
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

// A pick over 32 weights held by a group of four lanes (sub-lane s holds entries
// [8 s, 8 s + 8)): the first entry whose running sum exceeds target(total), else
// the last positive one, exactly as pick_by_scan (common/sampling_hierarchy.h)
// over the same integers; with the picked entry's weight. Every lane of the warp
// calls it (its shuffles span the warp); group0 is the group's first lane.
// The running sums never decrease, so the entries whose sum stays at or below the
// target are a prefix of the 32, and their count is the index of the first one
// above it: one compare per entry and a count, no search. The fallback for a
// target at or past the total (rounding at the top, or a lane past the row's
// draws, whose weights are all zero) is worked out only in warps that need it:
// worked out in every warp, it is a large share of the sampler's instructions.
struct GroupPick {
  uint32_t index;
  uint64_t weight;
};
template <typename TargetFn>
__device__ __forceinline__ GroupPick group_pick(const uint64_t (&w)[8], uint32_t sub, uint32_t group0,
                                                TargetFn target_of) {
  uint64_t mine = 0;
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) mine += w[e];
  // Exclusive scan and total over the four sub-lanes.
  uint64_t incl = mine;
#pragma unroll
  for (uint32_t o = 1; o < 4; o <<= 1) {
    const uint64_t t = __shfl_up_sync(0xffffffffu, incl, o);
    if (sub >= o) incl += t;
  }
  const uint64_t total = __shfl_sync(0xffffffffu, incl, 3, 4);
  const uint64_t tgt = target_of(total);
  uint64_t run = incl - mine;
  uint32_t at_or_below = 0;
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) {
    run += w[e];
    at_or_below += run <= tgt;
  }
#pragma unroll
  for (uint32_t o = 1; o < 4; o <<= 1) at_or_below += __shfl_xor_sync(0xffffffffu, at_or_below, o, 4);
  uint32_t pick = at_or_below;
  if (__any_sync(0xffffffffu, total <= tgt)) {
    // Past the total: the last positive entry.
    uint32_t positive = 0;  // bit 8 sub + e: entry e of this sub-lane has weight
#pragma unroll
    for (uint32_t e = 0; e < 8; ++e) positive |= uint32_t{w[e] != 0} << (8 * sub + e);
#pragma unroll
    for (uint32_t o = 1; o < 4; o <<= 1) positive |= __shfl_xor_sync(0xffffffffu, positive, o, 4);
    if (total <= tgt) pick = positive ? 31 - __clz(positive) : 0;
  }
  uint64_t pw = 0;  // the picked weight, from the sub-lane holding it (no dynamic index)
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) pw = 8 * sub + e == pick ? w[e] : pw;
  return {pick, __shfl_sync(0xffffffffu, pw, group0 + pick / 8)};
}

constexpr uint32_t kSampleThreads = 256;
constexpr uint32_t kSampleBlocksPerSm = 4;
// Draws per warp and per sampler block when each group of four lanes takes
// group_draws (8 groups a warp).
constexpr uint32_t sample_warp_draws(uint32_t group_draws) { return 8 * group_draws; }
constexpr uint32_t sample_block_draws(uint32_t group_draws) {
  return kSampleThreads / 32 * sample_warp_draws(group_draws);
}
// A group's draws are taken two at a time: half the live registers of all four
// at once, so four blocks fit a multiprocessor instead of three (64 registers).
constexpr uint32_t kDrawsPerPass = 2;
constexpr uint32_t kPrefixSmem = 4096;  // rows of up to 4M candidates: chunk prefixes in shared memory
constexpr uint32_t kPrefixPerThread = kPrefixSmem / kSampleThreads;

// Every block of a row first builds the row's chunk prefix sums in shared memory
// (a few KB from L2, the same deterministic order in every block, no separate
// kernel), so the binary search per draw reads shared memory; block 0 records the
// total. Longer rows use the prefixes of chunk_prefix_kernel from global memory.
// Compiled for uniform and for proportional weights (as the top-k filter that
// summed them), so no weight pays a test for either. kGroupDraws: draws per group
// of four lanes, 4 (the warp's 32 draws, two passes) or 2 (16 draws, one pass:
// twice the warps for the same draws, where they would not fill the GPU anyway).
template <bool kUniform, uint32_t kGroupDraws>
__global__ void __launch_bounds__(kSampleThreads, kSampleBlocksPerSm) sample_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  constexpr uint32_t kWarpDraws = sample_warp_draws(kGroupDraws), kBlockDraws = sample_block_draws(kGroupDraws);
  stage_begin();
  __shared__ uint64_t prefix_s[kPrefixSmem];
  __shared__ uint64_t total_s;
  const RowRef r = row_ref(b);
  const DecodeItem& it = *r.it;
  RowState& st = ws.rows[r.row];
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp_draw0 = blockIdx.x * kBlockDraws + threadIdx.x / 32 * kWarpDraws;
  const uint32_t j = warp_draw0 + lane;  // lanes [0, kWarpDraws) draw
  if (it.n_select == 0 || blockIdx.x * kBlockDraws >= st.n_draws) return;  // whole block
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
  // Whole warps leave; inside a warp every lane takes part in its groups' draws.
  if (warp_draw0 >= st.n_draws || w_total == 0) return;
  bool mine = lane < kWarpDraws && j < st.n_draws;
  // Sharded: targets over the mass of every shard; this one's starts at
  // mass_begin (and the last shard with mass also takes a target at the total).
  const bool sharded = st.mass_total != 0;
  const uint64_t mass_total = sharded ? st.mass_total : w_total, mass_begin = sharded ? st.mass_begin : 0;
  const bool last_mass = mass_begin + w_total == mass_total;
  // Integer targets u * total (a rounding up to the total itself picks the last
  // weighted entry, as on the CPU).
  auto target = [](uint32_t bits, uint64_t total) {
    return static_cast<uint64_t>(rng_uniform(bits) * static_cast<double>(total));
  };
  // Each lane draws its own chunk: Philox draw j of the stream (seed, step,
  // layer, q head), its first uniform through the chunk prefix sums.
  uint32_t my_chunk = 0, my_u1 = 0, my_u2 = 0;
  if (mine) {
    const uint64_t step = b.step_of(blockIdx.z);
    const Philox4 v = rng_draw(make_rng_stream(b.seed, step, b.layer, b.rng_head(r.h)), j);
    const uint64_t t = target(v.v[0], mass_total);
    if (sharded) mine = (t >= mass_begin && t - mass_begin < w_total) || (last_mass && t >= mass_total);
    my_chunk = mine ? pick_from_prefix(prefix, n_chunks, t - mass_begin) : 0;
    my_u1 = v.v[1];
    my_u2 = v.v[2];
  }
  // The block and token picks go to groups of four lanes: group g takes the
  // draws of lanes g, g + 8, g + 16 and g + 24 (g and g + 8 with 2 draws a
  // group), and sub-lane s holds entries [8 s, 8 s + 8) of the 32 block sums,
  // then of the block's 32 scores. A group reads each 256-byte row of block sums
  // and each 128-byte block of scores together: fewer than half the cache
  // wavefronts of one draw per thread.
  const uint32_t g = lane >> 2, sub = lane & 3;
  const uint32_t group0 = lane & ~3u;
  const float* row_s = row_scores(ws, r) + it.sink_end;
  const bool aligned = cand_scores_aligned(it);
  const float mx = key_float(st.max_key);  // finite: some candidate has weight
#pragma unroll 1
  for (uint32_t pass = 0; pass < kGroupDraws / kDrawsPerPass; ++pass) {
    uint32_t chunk[kDrawsPerPass], u1[kDrawsPerPass], u2[kDrawsPerPass];
    bool ok[kDrawsPerPass];
#pragma unroll
    for (uint32_t d = 0; d < kDrawsPerPass; ++d) {
      const uint32_t src = g + 8 * (kDrawsPerPass * pass + d);
      chunk[d] = __shfl_sync(0xffffffffu, my_chunk, src);
      u1[d] = __shfl_sync(0xffffffffu, my_u1, src);
      u2[d] = __shfl_sync(0xffffffffu, my_u2, src);
      ok[d] = __shfl_sync(0xffffffffu, mine, src);
    }
    // All block-sum loads of the group's draws before any is used.
    uint64_t bs[kDrawsPerPass][8];
#pragma unroll
    for (uint32_t d = 0; d < kDrawsPerPass; ++d) {
      const ulonglong2* p = reinterpret_cast<const ulonglong2*>(
          ws.bsum + bbase + size_t{chunk[d]} * kBlocksPerChunk + 8 * sub);
#pragma unroll
      for (uint32_t q = 0; q < 4; ++q) {
        const ulonglong2 a = ok[d] ? p[q] : make_ulonglong2(0, 0);
        bs[d][2 * q] = a.x;
        bs[d][2 * q + 1] = a.y;
      }
    }
    // The block within the chunk: the first entry whose running sum exceeds the
    // target (the chunk's total is the sum of its block sums, as csum holds).
    uint32_t blk[kDrawsPerPass];
    uint64_t block_w[kDrawsPerPass];
#pragma unroll
    for (uint32_t d = 0; d < kDrawsPerPass; ++d) {
      const GroupPick pk = group_pick(bs[d], sub, group0, [&](uint64_t total) { return target(u1[d], total); });
      blk[d] = chunk[d] * kBlocksPerChunk + pk.index;
      block_w[d] = pk.weight;
    }
    // The blocks' scores (16-byte loads where the row's candidates start aligned)
    // and heavy bits, all issued before the weights are computed.
    float sv[kDrawsPerPass][8];
    uint32_t heavy[kDrawsPerPass];
#pragma unroll
    for (uint32_t d = 0; d < kDrawsPerPass; ++d) {
      const uint32_t i0 = blk[d] * kBlockTokens + 8 * sub;  // this sub-lane's first candidate
      const float* p = row_s + i0;
      heavy[d] = ok[d] ? ws.heavy_bits[bbase + blk[d]] : ~0u;
      if (aligned && ok[d] && i0 + 8 <= nc) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], c = reinterpret_cast<const float4*>(p)[1];
        sv[d][0] = a.x; sv[d][1] = a.y; sv[d][2] = a.z; sv[d][3] = a.w;
        sv[d][4] = c.x; sv[d][5] = c.y; sv[d][6] = c.z; sv[d][7] = c.w;
      } else {
#pragma unroll
        for (uint32_t e = 0; e < 8; ++e) sv[d][e] = ok[d] && i0 + e < nc ? p[e] : -INFINITY;
      }
    }
    // The candidate within the block, by the same rule over its fixed-point weights
    // (0 for heavy and masked candidates); one lane sets the sample bit.
#pragma unroll
    for (uint32_t d = 0; d < kDrawsPerPass; ++d) {
      uint64_t w[8];
#pragma unroll
      for (uint32_t e = 0; e < 8; ++e) {
        const uint64_t fixed = cand_weight_of<kUniform>(sv[d][e], mx).fixed;
        w[e] = (heavy[d] >> (8 * sub + e)) & 1u ? 0 : fixed;
      }
      const uint64_t in_block = target(u2[d], block_w[d]);
      const GroupPick pk = group_pick(w, sub, group0, [&](uint64_t) { return in_block; });
      if (ok[d] && sub == 0) {
        atomicOr(&ws.sample_bits[bbase + blk[d]], 1u << pk.index);
        if (b.record_draws) {
          const uint32_t jd = warp_draw0 + g + 8 * (kDrawsPerPass * pass + d);
          ws.draw_tokens[row_select(r) + jd] = it.sink_end + blk[d] * kBlockTokens + pk.index;
        }
      }
    }
  }
}

}  // namespace

cudaError_t launch_hierarchy(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws, int mode,
                             cudaStream_t st) {
  const uint32_t chunks = plan.n_pad_max / kChunkTokens;
  const dim3 grid((chunks + kChunksPerBlock - 1) / kChunksPerBlock, b.sel_heads(), b.n_items);
  return launch_stage(b, hierarchy_kernel, grid, 32 * kChunksPerBlock, 0, st, b, ws, mode);
}

cudaError_t launch_chunk_prefix(const DecodeBatch& b, const WorkspacePlan&, const Workspace& ws,
                                cudaStream_t st) {
  return launch_stage(b, chunk_prefix_kernel, dim3(1, b.sel_heads(), b.n_items), 1024, 0, st, b, ws);
}

cudaError_t launch_sampling(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t st) {
  cudaError_t e;
  if (b.sampling == Sampling::kNone) return cudaSuccess;
  // Otherwise the sums came from the top-k filter.
  if (!filter_sums_residual(b) && (e = launch_hierarchy(b, plan, ws, 0, st)) != cudaSuccess) return e;
  if (plan.n_pad_max / kChunkTokens > kPrefixSmem && (e = launch_chunk_prefix(b, plan, ws, st)) != cudaSuccess)
    return e;
  return launch_draws(b, plan, ws, st);
}

cudaError_t launch_draws(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws, cudaStream_t st) {
  if (b.sampling == Sampling::kNone) return cudaSuccess;
  const uint32_t block_draws = sample_block_draws(plan.sample_group_draws);
  const dim3 grid(std::max(1u, (plan.draws_max + block_draws - 1) / block_draws), b.sel_heads(), b.n_items);
  const bool uniform = b.sampling == Sampling::kUniform;
  const auto kernel = plan.sample_group_draws == 2 ? (uniform ? sample_kernel<true, 2> : sample_kernel<false, 2>)
                                                   : (uniform ? sample_kernel<true, 4> : sample_kernel<false, 4>);
  return launch_stage(b, kernel, grid, kSampleThreads, 0, st, b, ws);
}

uint32_t sample_group_draws(uint32_t draws_max, uint32_t rows, int sm_count) {
  // 16 draws a warp where even then every row's draws fit one wave of sampler
  // blocks (batch 1 at 128K tokens: the draws are a chain of dependent loads and
  // picks per warp, and the GPU has room for twice the warps). Elsewhere 32: the
  // grid already fills the GPU, and twice the blocks would only rebuild the chunk
  // prefixes twice as often.
  const uint32_t per_block = sample_block_draws(2);
  const uint64_t blocks16 = uint64_t{rows} * ((draws_max + per_block - 1) / per_block);
  return blocks16 <= uint64_t{kSampleBlocksPerSm} * static_cast<uint64_t>(std::max(sm_count, 1)) ? 2 : 4;
}

}  // namespace ssa::cuda
