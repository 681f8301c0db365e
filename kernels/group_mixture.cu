// The mixture proposal of group selection (SSA_GROUP_MIXTURE,
// docs/GROUP_SELECTION.md): the selection row of KV head k scores each candidate
// t by the logit of the mixture of its G q heads' proxy softmaxes,
//   s~(t) = log sum_j softmax(s~_j)(t) = log sum_j exp(s~_j(t) - max_j) / Z_j,
// which is what the CPU's mixture_logits computes (the same float operations in
// the same order, so the two agree to the rounding of exp and of the proxy
// scores themselves). Three stages:
//  1. every q head's proxy scores (PQ or exact) into scratch rows of the per-head
//     layout, by the per-head scoring kernels run on a copy of the batch with
//     group selection off (scratch_batch): each q head's largest score comes with
//     them;
//  2. each head's normaliser Z_j = sum_t exp(s~_j(t) - max_j): one warp per
//     1024-candidate chunk writes its chunk's sum (fixed order, so the sums and
//     everything after them are the same in every run);
//  3. one pass per KV head writes the mixture logits into the selection row, with
//     its largest and smallest value (the top-k histogram's range, as for the
//     exact proxy).
// The rest of the decode (top-k, water-filling, sampling, compaction) runs on the
// selection rows unchanged: its proposal is the softmax of these logits.
#include <algorithm>

#include "device_util.cuh"
#include "head_dim.cuh"  // ensure_dynamic_smem
#include "row_ref.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kNormChunksPerBlock = 8;  // one warp per chunk
constexpr int kMixThreads = 256;
constexpr uint32_t kMixTile = 4096;  // tokens per block of the mixture pass

// The batch the per-head scoring kernels see: group selection off (one row per
// q head), every item's rows at G times its selection rows' offset (the per-head
// layout of Workspace::head_scores, the same n_pad per row).
DecodeBatch scratch_batch(const DecodeBatch& b) {
  DecodeBatch h = b;
  h.group = GroupProposal::kOff;
  const uint32_t G = b.shape.group();
  for (uint32_t i = 0; i < h.n_items; ++i) h.items[i].score_base = b.items[i].score_base * G;
  return h;
}

// ... and the workspace they write: scores, row states and histograms of the
// scratch rows; no compaction counts (the scratch rows are never compacted).
Workspace scratch_workspace(const Workspace& ws) {
  Workspace h = ws;
  h.scores = ws.head_scores;
  h.rows = ws.head_rows;
  h.hist = ws.head_hist;
  h.compact_passes = 0;
  return h;
}

__device__ __forceinline__ bool selects(const DecodeItem& it) { return item_selects(it); }

// exp(s - mx) as the CPU's exp_shifted takes it, 0 for a masked score.
__device__ __forceinline__ float shifted_exp(float s, float mx) {
  return s == -INFINITY ? 0.f : expf(__fsub_rn(s, mx));
}

// Stage 2, on the scratch batch: grid (chunks / 8, q heads, items).
__global__ void __launch_bounds__(32 * kNormChunksPerBlock) head_norm_kernel(const __grid_constant__ DecodeBatch bh, Workspace wh) {
  stage_begin();
  __shared__ ChunkTile tile_s[kNormChunksPerBlock];
  const RowRef r = row_ref(bh);
  const DecodeItem& it = *r.it;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t chunk = blockIdx.x * kNormChunksPerBlock + warp;
  const uint32_t nc = it.local_begin - it.sink_end;
  if (!selects(it) || chunk * kChunkTokens >= nc) return;  // whole warps leave
  const float mx = key_float(wh.rows[r.row].max_key);
  const float* cs = row_scores(wh, r) + it.sink_end + size_t{chunk} * kChunkTokens;
  const uint32_t n_here = min(kChunkTokens, nc - chunk * kChunkTokens);
  ChunkTile& tile = tile_s[warp];
  load_chunk_tile(tile, cs, n_here, lane);  // -inf past the end
  double block = 0.0;
#pragma unroll 8
  for (uint32_t i = 0; i < kBlockTokens; ++i) block += static_cast<double>(shifted_exp(tile[lane][i], mx));
  const double sum = warp_sum(block);
  if (lane == 0) wh.head_csum[row_chunk_base(it, r.h) + chunk] = sum;
}

// Offsets of q head qh's scratch row (scratch_batch's layout: the item's rows at
// G times its selection rows' offset) in the per-token and per-chunk arrays.
__device__ __forceinline__ size_t scratch_token_base(const DecodeItem& it, uint32_t G, uint32_t qh) {
  return it.score_base * G + size_t{qh} * it.n_pad;
}
__device__ __forceinline__ size_t scratch_chunk_base(const DecodeItem& it, uint32_t G, uint32_t qh) {
  return scratch_token_base(it, G, qh) / kChunkTokens;  // score_base and n_pad: whole chunks
}

// A q head's terms of the mixture from its chunk sums (n_chunks of them) and its
// largest score, by one warp: Z_j in a fixed order (lane-strided chunk sums, then
// a butterfly), so every caller with the same sums gets the same value. Lane 0's
// result: max_j, 1 / Z_j (rounded to float as on the CPU) and max_j + log Z_j
// (the fallback where every term underflows).
struct HeadTerms {
  float mx, inv, shift;
};
__device__ __forceinline__ HeadTerms head_terms(const double* csum, uint32_t n_chunks, uint32_t max_key,
                                                uint32_t lane) {
  double z = 0.0;
  for (uint32_t c = lane; c < n_chunks; c += 32) z += csum[c];
  z = warp_sum(z);
  const float mx = key_float(max_key);
  const bool ok = z > 0.0 && mx != -INFINITY;  // a head with no finite score adds nothing
  return {mx, ok ? static_cast<float>(1.0 / z) : 0.f, ok ? __fadd_rn(mx, static_cast<float>(log(z))) : INFINITY};
}

// Stage 3: grid (tiles of kMixTile tokens, KV heads, items); dynamic shared
// memory [3][G] floats. given: the heads' terms, [batch item][q head][3] at
// terms (a sharded decode's, over every shard's chunks; map: the items' batch
// indices); else each head's own from its chunk sums here.
__global__ void __launch_bounds__(kMixThreads) mixture_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, const float* given,
                                                              ShardBatchItems map) {
  stage_begin();
  extern __shared__ float mix_s[];
  __shared__ uint32_t max_s, min_s;
  const uint32_t item = blockIdx.z, kvh = blockIdx.y;
  const DecodeItem& it = b.item(item);
  const uint32_t t0 = blockIdx.x * kMixTile;
  if (!selects(it) || t0 >= it.n_pad) return;
  const uint32_t G = b.shape.group(), nq = b.shape.n_q_heads;
  float* mx_s = mix_s;             // max_j
  float* inv_s = mix_s + G;        // 1 / Z_j
  float* shift_s = mix_s + 2 * G;  // max_j + log Z_j
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31, n_warps = kMixThreads / 32;
  const uint32_t nc = it.local_begin - it.sink_end;
  const uint32_t n_chunks = (nc + kChunkTokens - 1) / kChunkTokens;
  if (given != nullptr) {
    for (uint32_t j = threadIdx.x; j < G; j += blockDim.x) {
      const float* t = given + (size_t{map.batch_item[item]} * nq + kvh * G + j) * 3;
      mx_s[j] = t[0];
      inv_s[j] = t[1];
      shift_s[j] = t[2];
    }
  } else {
    for (uint32_t j = warp; j < G; j += n_warps) {
      const uint32_t qh = kvh * G + j;
      const HeadTerms h = head_terms(ws.head_csum + scratch_chunk_base(it, G, qh), n_chunks,
                                     ws.head_rows[row_of(item, qh, nq)].max_key, lane);
      if (lane == 0) {
        mx_s[j] = h.mx;
        inv_s[j] = h.inv;
        shift_s[j] = h.shift;
      }
    }
  }
  if (threadIdx.x == 0) {
    max_s = 0u;
    min_s = 0xffffffffu;
  }
  __syncthreads();
  const float* hs = ws.head_scores + scratch_token_base(it, G, kvh * G);  // q head j's row at + j * n_pad
  float* out = ws.scores + row_token_base(it, kvh);
  uint32_t local_max = 0u, local_min = 0xffffffffu;
  const uint32_t t_end = min(it.n_pad, t0 + kMixTile);
  for (uint32_t t = t0 + threadIdx.x; t < t_end; t += kMixThreads) {
    float logit = -INFINITY;
    if (t >= it.sink_end && t < it.local_begin) {
      float sum = 0.f, top = -INFINITY;
      for (uint32_t j = 0; j < G; ++j) {
        const float s = hs[size_t{j} * it.n_pad + t];
        sum = __fadd_rn(sum, __fmul_rn(shifted_exp(s, mx_s[j]), inv_s[j]));
        top = fmaxf(top, __fsub_rn(s, shift_s[j]));
      }
      logit = sum > 0.f ? logf(sum) : top;
      local_max = max(local_max, float_key(logit));
      local_min = min(local_min, float_key(logit));
    }
    out[t] = logit;
  }
  local_max = __reduce_max_sync(0xffffffffu, local_max);
  local_min = __reduce_min_sync(0xffffffffu, local_min);
  if (lane == 0 && local_max != 0u) {
    atomicMax(&max_s, local_max);
    atomicMin(&min_s, local_min);
  }
  __syncthreads();
  if (threadIdx.x == 0 && max_s != 0u) {
    RowState& st = ws.rows[row_of(item, kvh, b.sel_heads())];
    atomicMax(&st.max_key, max_s);
    atomicMin(&st.min_key, min_s);
  }
}

// A sharded decode's heads' terms: one warp per (batch row of a q head), from
// the chunk sums of every shard laid out [row][chunks_stride] in global chunk
// order, as the unsharded stage 3 reads them.
__global__ void terms_kernel(const double* csum, uint32_t chunks_stride, const ShardMixtureRow* rows,
                             uint32_t n_rows, float* terms) {
  const uint32_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= n_rows) return;  // whole warps
  const ShardMixtureRow r = rows[row];
  const HeadTerms h = head_terms(csum + size_t{row} * chunks_stride, r.n_chunks, r.max_key, lane);
  if (lane == 0) {
    terms[3 * size_t{row}] = h.mx;
    terms[3 * size_t{row} + 1] = h.inv;
    terms[3 * size_t{row} + 2] = h.shift;
  }
}

}  // namespace

cudaError_t launch_mixture_head_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                       cudaStream_t st) {
  if (b.group != GroupProposal::kMixture || b.proxy == Proxy::kNone) return cudaErrorInvalidValue;
  const DecodeBatch bh = scratch_batch(b);
  const Workspace wh = scratch_workspace(ws);
  if (b.proxy == Proxy::kPq) return launch_pq_scores(bh, plan, wh, st);  // its lookup-table kernel sets the scratch rows up
  const cudaError_t e = launch_init_rows(bh, plan, wh, st);
  return e != cudaSuccess ? e : launch_exact_scores(bh, plan, wh, st);
}

cudaError_t launch_mixture_norms(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st) {
  const DecodeBatch bh = scratch_batch(b);
  const Workspace wh = scratch_workspace(ws);
  const uint32_t chunks = plan.n_pad_max / kChunkTokens;
  const dim3 norm_grid((chunks + kNormChunksPerBlock - 1) / kNormChunksPerBlock, b.shape.n_q_heads, b.n_items);
  return launch_stage(b, head_norm_kernel, norm_grid, 32 * kNormChunksPerBlock, 0, st, bh, wh);
}

cudaError_t launch_mixture_logits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                  const float* terms, const ShardBatchItems& map, cudaStream_t st) {
  const size_t smem = size_t{3} * b.shape.group() * sizeof(float);
  const dim3 mix_grid((plan.n_pad_max + kMixTile - 1) / kMixTile, b.shape.n_kv_heads, b.n_items);
  const cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(mixture_kernel), smem);
  if (e != cudaSuccess) return e;
  return launch_stage(b, mixture_kernel, mix_grid, kMixThreads, smem, st, b, ws, terms, map);
}

cudaError_t launch_mixture_terms(const double* csum, uint32_t chunks_stride, const ShardMixtureRow* rows,
                                 uint32_t n_rows, float* terms, cudaStream_t st) {
  if (n_rows == 0) return cudaSuccess;
  terms_kernel<<<(n_rows + 7) / 8, 256, 0, st>>>(csum, chunks_stride, rows, n_rows, terms);
  return cudaGetLastError();
}

cudaError_t launch_group_mixture(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st) {
  cudaError_t e = launch_mixture_head_scores(b, plan, ws, st);
  if (e == cudaSuccess) e = launch_mixture_norms(b, plan, ws, st);
  return e != cudaSuccess ? e : launch_mixture_logits(b, plan, ws, nullptr, ShardBatchItems{}, st);
}

}  // namespace ssa::cuda
