// Small device helpers shared by the decode kernels: dtype loads, order-preserving
// float keys, warp reductions and the token order of a row's read set.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "common/sampling_hierarchy.h"
#include "decode_types.h"

namespace ssa::cuda {

// Maps float to uint32 so that unsigned order equals float order (-inf lowest).
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  return __uint_as_float(u);
}

template <typename T> struct Elem;
template <> struct Elem<float> {
  __device__ static float load(const float* p) { return *p; }
  __device__ static void store(float* p, float v) { *p = v; }
};
template <> struct Elem<__half> {
  __device__ static float load(const __half* p) { return __half2float(*p); }
  __device__ static void store(__half* p, float v) { *p = __float2half_rn(v); }
};
template <> struct Elem<__nv_bfloat16> {
  __device__ static float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  __device__ static void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};

// Loads 8 consecutive elements (16-byte aligned for 2-byte types, 32 for float).
__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
__device__ __forceinline__ void load8(const __half* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Residual sampling weights in fixed point: w = exp(s~ - max) in [0, 1] (1 when
// sampling uniformly) times 2^38, rounded. Integer sums are exact and the same in
// any order, so the top-k filter can sum each block before the boundary bin is
// resolved, and the refine step subtracts the boundary candidates it selects with
// atomics, both without changing a bit between runs. Each weight is at most 2^38,
// so the sums of fewer than 2^26 candidates (kMaxSampledCandidates) stay below
// 2^64; weights under 2^-39 of the maximum (27 logits below it) round to 0 and
// are never drawn.
constexpr float kWeightOne = 274877906944.0f;  // 2^38
// A candidate's proposal weight e = exp(s~ - max), as the CPU computes it, and its
// fixed-point sampling weight (e, or 1 when sampling uniformly); 0 for a masked score.
// e * 2^38 is exact in float (a power-of-two scale of e <= 1), so rounding it from
// float gives the same integer as from double, without the two double conversions
// (a slow pipe, paid for every candidate by the filter and 32 times per draw).
struct CandWeight {
  float e;
  uint64_t fixed;
};
__device__ __forceinline__ CandWeight cand_weight(float s, float mx, bool uniform) {
  if (s == -INFINITY) return {0.f, 0};
  const float e = expf(s - mx);
  return {e, uniform ? static_cast<uint64_t>(kWeightOne) : __float2ull_rn(e * kWeightOne)};
}

// The same for proportional weights where max is finite, without the test for
// a masked score: expf(-inf) is 0, and 0 converts to 0.
__device__ __forceinline__ CandWeight cand_weight_unmasked(float s, float mx) {
  const float e = expf(s - mx);
  return {e, __float2ull_rn(e * kWeightOne)};
}

// The weight rule of a kernel compiled for uniform or for proportional weights
// (max finite): the top-k filter sums these and the sampler recomputes them, so
// both take them from here.
template <bool kUniform>
__device__ __forceinline__ CandWeight cand_weight_of(float s, float mx) {
  return kUniform ? cand_weight(s, mx, true) : cand_weight_unmasked(s, mx);
}

// Token of read-set position p of a row: sink tokens, local tokens, heavy list,
// then the sorted unique samples (the only positions with pi < 1).
struct ReadSet {
  uint32_t n_sink, local_begin, n_local, n_heavy, n_unique;
  const uint32_t* heavy;
  const uint32_t* sampled;
  const float* sampled_log_pi;
  uint32_t first = 0;  // the sink tokens are [first, first + n_sink) (DecodeItem::first_token)
  __device__ uint32_t size() const { return n_sink + n_local + n_heavy + n_unique; }
  __device__ uint32_t token(uint32_t p, float* log_pi) const {
    *log_pi = 0.f;
    if (p < n_sink) return first + p;
    p -= n_sink;
    if (p < n_local) return local_begin + p;
    p -= n_local;
    if (p < n_heavy) return heavy[p];
    p -= n_heavy;
    *log_pi = sampled_log_pi[p];
    return sampled[p];
  }
};

// Row index of (item, head) among rows of n_heads heads per item (selection rows:
// DecodeBatch::sel_heads(); attention rows: n_q_heads).
__device__ __forceinline__ uint32_t row_of(uint32_t item, uint32_t head, uint32_t n_heads) {
  return item * n_heads + head;
}

// Read set of q head h of an item: the selection row it attends with (its own,
// or its KV group's with group selection). A dense item (also inside a sparse
// batch) reads every token in order.
__device__ __forceinline__ ReadSet row_read_set(const DecodeBatch& b, const Workspace& ws, uint32_t item,
                                                uint32_t h) {
  const DecodeItem& it = b.item(item);
  ReadSet rs{it.n_tokens - it.first_token, it.n_tokens, 0, 0, 0, nullptr, nullptr, nullptr, it.first_token};
  if (it.sink_end < it.local_begin) {
    const uint32_t sh = b.sel_head_of(h);
    const RowState& st = ws.rows[row_of(item, sh, b.sel_heads())];
    const size_t sel = it.select_base + size_t{sh} * it.select_cap;
    rs = ReadSet{it.sink_end - it.first_token, it.local_begin, it.n_tokens - it.local_begin, st.n_heavy,
                 st.n_unique, ws.heavy + sel, ws.uniq_sorted + sel, ws.log_pi + sel, it.first_token};
  }
  return rs;
}

// Positions [*p0, *p1) of a read set of P positions that split `split` of
// n_splits takes (contiguous, equal lengths but the last).
__device__ __forceinline__ void split_range(uint32_t P, uint32_t n_splits, uint32_t split, uint32_t* p0,
                                            uint32_t* p1) {
  const uint32_t per = (P + n_splits - 1) / n_splits;
  *p0 = min(P, split * per);
  *p1 = min(P, *p0 + per);
}

// Whether an item's candidate scores (from token sink_end) start 16 bytes aligned
// in every row, so that the filter and the draws may read them with 16-byte
// loads: row bases are whole chunks, so when sink_end is a multiple of 4.
__host__ __device__ __forceinline__ bool cand_scores_aligned(const DecodeItem& it) {
  return (it.sink_end & 3u) == 0;
}

// Offset of selection head h's row in the per-token arrays of the workspace
// (scores): rows of n_pad entries, one per selection head, item after item.
__device__ __forceinline__ size_t row_token_base(const DecodeItem& it, uint32_t h) {
  return it.score_base + size_t{h} * it.n_pad;
}

// Offset of head h's first 32-candidate block in the per-block arrays of the
// workspace (bsum and the heavy/sample bitmaps: one entry per block).
__device__ __forceinline__ size_t row_block_base(const DecodeItem& it, uint32_t h) {
  return it.score_base / kBlockTokens + size_t{h} * (it.n_pad / kBlockTokens);
}

// ... and of its first 1024-candidate chunk in the per-chunk arrays (csum, cprefix).
__device__ __forceinline__ size_t row_chunk_base(const DecodeItem& it, uint32_t h) {
  return it.score_base / kChunkTokens + size_t{h} * (it.n_pad / kChunkTokens);
}

// A row's compaction counts for one pass (Workspace::compact_counts: [pass][rows]
// [blocks], blocks per row of the compaction; kernels/bitmap_compact.cu).
__device__ __forceinline__ uint64_t* row_compact_counts(uint64_t* counts, uint32_t pass, uint32_t n_rows,
                                                        uint32_t row, uint32_t blocks) {
  return counts + (size_t{pass} * n_rows + row) * blocks;
}

// Shared-memory tile of one warp's 1024-candidate chunk, padded so that a lane
// reading down its own row does not conflict with the others.
using ChunkTile = float[kBlocksPerChunk][kBlockTokens + 1];

// Loads the chunk's scores (n_here of them, -inf past the end) coalesced, so that
// afterwards lane l reads its 32-candidate block as tile[l][0..31]: each lane then
// handles one block in order without shuffles. Every lane of the warp calls it.
__device__ __forceinline__ void load_chunk_tile(ChunkTile& tile, const float* chunk_scores, uint32_t n_here,
                                                uint32_t lane) {
#pragma unroll 8
  for (uint32_t q = 0; q < kBlocksPerChunk; ++q) {
    const uint32_t i = q * kBlockTokens + lane;
    tile[q][lane] = i < n_here ? chunk_scores[i] : -INFINITY;
  }
  __syncwarp();
}

// Whether the top-k filter also sums the residual weights per block and chunk:
// with the fixed heavy rule the heavy set is final after top-k. The adaptive rule
// drops some top-k candidates later, and its sums come from a separate pass.
__host__ __device__ __forceinline__ bool filter_sums_residual(const DecodeBatch& b) {
  return b.sampling != Sampling::kNone && b.heavy == HeavyRule::kFixed;
}

// How many candidates top-k keeps in a sparse row (before its cut finds fewer
// candidates than that): |H| with the fixed heavy rule, k' with the adaptive one
// (top-k' first, then water-filling).
__host__ __device__ __forceinline__ uint32_t requested_topk(const DecodeBatch& b, const DecodeItem& it) {
  return b.heavy == HeavyRule::kAdaptive ? it.n_select : it.n_heavy;
}

// Top-k histogram bins of a row's candidate scores: kScoreBins equal steps down
// from `top`; scores above it share bin 0, scores below the range (and -inf) the
// last bin. Non-increasing in the score, so every candidate of a lower bin has a
// strictly larger score than every candidate of a higher one; only the boundary
// bin needs exact comparisons. The selected set does not depend on the range
// (refine cuts the boundary bin exactly); how many candidates the boundary bin
// holds does. The kernel that builds the histogram stores its bins in the
// RowState, and the filter bins every candidate the same way from there.
struct ScoreBins {
  float scale, offset;  // bin = scale * (top - s), as one fused multiply-add
  // Bins over [bottom, top], at most max_span wide (a NaN or infinite span: one bin).
  __device__ static ScoreBins over(float top, float bottom, float max_span) {
    float span = top - bottom;
    if (!(span <= max_span)) span = max_span;
    const float scale = span > 0.f && span < INFINITY ? static_cast<float>(kScoreBins) / span : 0.f;
    return {scale, scale == 0.f ? 0.f : top * scale};
  }
  __device__ static ScoreBins of_row(const RowState& st) { return {st.bin_scale, st.bin_offset}; }
  __device__ void store(RowState& st) const {
    st.bin_scale = scale;
    st.bin_offset = offset;
  }
  // The float-to-unsigned conversion saturates: negative (a score above top) to
  // 0, +inf to the largest value, NaN to 0.
  __device__ uint32_t bin(float s) const {
    return min(__float2uint_rz(fmaf(s, -scale, offset)), kScoreBins - 1);
  }
};

}  // namespace ssa::cuda
