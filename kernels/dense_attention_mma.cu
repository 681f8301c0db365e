// Dense split-K decode attention on tensor cores (flash decoding), f16 and bf16,
// head dims 64, 128 and 256. Same inputs and the same partial results
// ([m, l, acc[D]] per row and split, merged by merge_splits_kernel) as the
// CUDA-core kernel in sparse_attention.cu, which keeps f32, the other head dims,
// groups above 16 and every sparse row.
//
// Why: the CUDA-core kernel reduces every q.k dot product with warp shuffles and
// rescales per token, so it is issue-bound at about half of the memory bandwidth.
// Here one block serves all G q heads of a KV head over one split; K and V tiles
// stream through a cp.async ring in shared memory and both products run on
// mma.sync.m16n8k16 (f32 accumulate), so a K/V byte costs a few instructions.
//
// The products are computed transposed, with tokens as the MMA rows and the q heads
// of the group as the 8 columns: S^T = K Q^T, O^T += V^T P^T. A KV tile is then the
// row-major A operand straight from shared memory (ldmatrix; .trans for V), q fits
// the small B operand (D/8 registers), the accumulator O^T has no padding rows for
// G <= 8, and every thread holds the same two heads in S^T and in O^T, so the online
// softmax rescale needs no data movement. P^T goes from accumulator layout to
// B-operand layout with one movmatrix (8x8 transpose) per 8 tokens. G = 16 uses
// two 8-head tiles, each on its own warps over the same shared-memory tiles.
//
// Block: kTokenGroups x kHeadTiles warps; a stage holds kTile = 16 * kTokenGroups
// tokens and warp (token group tg, head tile ht) takes tokens [16 tg, 16 tg + 16)
// of each stage. Each warp keeps its own softmax state; the warps of a head tile
// merge by log-sum-exp at the end. Logits are kept in base 2 (q.k * log2(e) /
// sqrt(D)); m is written in natural-log units as the merge expects.
#include <algorithm>
#include <type_traits>

#include "cp_async.cuh"
#include "device_util.cuh"
#include "head_dim.cuh"
#include "mma_attention.cuh"
#include "mma_fragments.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

using namespace mma;

constexpr int kTokenGroups = 4;
constexpr int kTile = 16 * kTokenGroups;  // tokens per pipeline stage

template <int D>
struct MmaShape {
  // +16 bytes per shared-memory row: the 8 rows an ldmatrix reads start 4 banks
  // apart instead of on the same bank (row pitch would be a multiple of 128 B).
  static constexpr int kPitch = D + 8;
  static constexpr int kStageElems = 2 * kTile * kPitch;  // K tile, then V tile
  // Stages in flight vs blocks per SM: D = 64: 4 x 18 KB (3 blocks/SM);
  // D = 128: 3 x 34 KB (2 blocks/SM); D = 256: 3 x 66 KB (1 block/SM). Each
  // keeps 64 KB or more of loads in flight per SM.
  static constexpr int kStages = D == 64 ? 4 : 3;
  static constexpr int kOutPitch = D + 4;  // merge area: conflict-free fragment stores
  static constexpr size_t smem_bytes(int head_tiles) {
    const size_t ring = size_t{kStages} * kStageElems * 2;
    const size_t merge = size_t{kTokenGroups} * head_tiles * 8 * (kOutPitch + 2) * sizeof(float);
    return ring > merge ? ring : merge;
  }
};

template <int D>
uint32_t blocks_per_sm() {
  // 228 KB of shared memory per SM on sm_90, 1 KB of it reserved per block.
  return static_cast<uint32_t>((228 * 1024) / (MmaShape<D>::smem_bytes(1) + 1024));
}

// ---- the kernel -----------------------------------------------------------------

// Fragment layouts: mma_fragments.cuh.
template <int D, typename T, int kHeadTiles>
__global__ void __launch_bounds__(kTokenGroups * kHeadTiles * 32)
    dense_mma_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, uint32_t n_splits) {
  stage_begin();
  using S = MmaShape<D>;
  constexpr int kWarps = kTokenGroups * kHeadTiles, kThreads = kWarps * 32;
  constexpr int kP = S::kPitch;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  T* ring = reinterpret_cast<T*>(smem_raw);

  const uint32_t item = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
  const DecodeItem& it = b.item(item);
  if (item_idle(it)) return;  // a decode step that may not run (step_plan.h)
  const uint32_t G = b.shape.group();
  // The split rule of attention_split_kernel (same partial layout), over the
  // item's tokens [first_token, n_tokens).
  const uint32_t F = it.first_token, N = it.n_tokens - F;
  const uint32_t per = (N + n_splits - 1) / n_splits;
  const uint32_t p0 = F + min(N, split * per), p1 = F + min(N, p0 - F + per);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ht = warp % kHeadTiles, tg = warp / kHeadTiles;
  const int g = lane >> 2, t4 = lane & 3;

  // q^T as B fragments (unscaled: the scale is applied to S in f32).
  uint32_t qf[D / 16][2];
  load_q_fragments<D>(static_cast<const T*>(it.q) + size_t{kvh} * G * D, G, ht, g, t4, qf);
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(D));

  // This thread's two heads (2 t4, 2 t4 + 1 of the head tile): running max (base 2)
  // and this thread's share of the sum (reduced over g at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 16][4];  // O^T: dims mt * 16 + g (+8), heads 2 t4 + {0, 1}
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  const uint32_t page_mask = b.shape.page_tokens - 1, page_shift = b.shape.page_shift;
  const size_t row_base = size_t{kvh} * b.shape.page_tokens;
  const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;
  // Copies tile `tile` of the split into ring stage `stage`: 16-byte chunks, a row's
  // chunks on consecutive threads. The page is looked up per row, so any page size
  // works; rows past p1 are zero-filled.
  const uint64_t policy = l2_evict_first_policy();
  auto load_tile = [&](uint32_t tile, int stage) {
    constexpr int kChunks = D / 8;
    T* ks = ring + stage * S::kStageElems;
    T* vs = ks + kTile * kP;
    const uint32_t t0 = p0 + tile * kTile;
    static_assert((kTile * kChunks) % kThreads == 0, "whole copy rounds");
#pragma unroll
    for (int k = 0; k < kTile * kChunks / kThreads; ++k) {
      const int c = k * kThreads + threadIdx.x;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const uint32_t t = t0 + r;
      const uint32_t tt = t < p1 ? t : p0;  // a readable row; no bytes are copied
      const T* kp = reinterpret_cast<const T*>(it.kv_pages[tt >> page_shift]) +
                    (row_base + (tt & page_mask)) * D + col;
      const uint32_t bytes = t < p1 ? 16u : 0u;
      cp_async16(ks + r * kP + col, kp, bytes, policy);
      cp_async16(vs + r * kP + col, kp + v_off, bytes, policy);
    }
  };

  const uint32_t n_tiles = (p1 - p0 + kTile - 1) / kTile;
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (static_cast<uint32_t>(s) < n_tiles) load_tile(s, s);
    cp_async_commit();  // one group per stage, empty or not, keeps the wait count fixed
  }

  for (uint32_t i = 0; i < n_tiles; ++i) {
    cp_async_wait<S::kStages - 2>();  // tile i has landed (this thread's copies)
    __syncthreads();                  // ... everyone's; and stage i - 1 is free again
    {
      const uint32_t next = i + S::kStages - 1;
      if (next < n_tiles) load_tile(next, next % S::kStages);
      cp_async_commit();
    }
    const T* ks = ring + (i % S::kStages) * S::kStageElems + tg * 16 * kP;
    const T* vs = ks + kTile * kP;

    // S^T (16 tokens x 8 heads) = K Q^T.
    float raw[4];
    tile_logits<D, kP>(ks, lane, qf, raw);
    // Tokens g and g + 8 of this warp's 16; past the split end: -inf.
    const uint32_t tok = p0 + i * kTile + tg * 16 + g;
    float s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool valid = tok + (j >= 2 ? 8 : 0) < p1;
      s[j] = valid ? raw[j] * scale_log2 : -INFINITY;
    }

    float p[4];
    online_softmax_tile<D>(s, m, l, o, p);
    accumulate_pv<D, kP>(vs, lane, p, o);
  }

  write_group_partials<D, kTokenGroups, kHeadTiles, S::kOutPitch>(smem_raw, warp, g, t4, m, l, o, G, item, kvh,
                                                             b.shape.n_q_heads, n_splits, split, ws.partial);
}

template <int D, typename T, int kHeadTiles>
cudaError_t launch_typed(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                         cudaStream_t st) {
  const size_t smem = MmaShape<D>::smem_bytes(kHeadTiles);
  auto kernel = dense_mma_kernel<D, T, kHeadTiles>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  return launch_stage(b, kernel, dim3(plan.n_splits, b.shape.n_kv_heads, b.n_items),
                      kTokenGroups * kHeadTiles * 32, smem, st, b, ws, plan.n_splits);
}

}  // namespace

bool dense_mma_supported(const DecodeShape& s) {
  const bool dtype_ok = s.dtype == DType::kF16 || s.dtype == DType::kBF16;
  const bool dim_ok = s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256;
  return dtype_ok && dim_ok && s.n_kv_heads > 0 && s.group() >= 1 && s.group() <= 16;
}

uint32_t dense_mma_splits(const DecodeShape& s, uint32_t n_items, uint32_t max_tokens, int sm_count) {
  uint32_t per_sm = 1;
  dispatch_head_dim(s.head_dim, [&](auto dc) { per_sm = blocks_per_sm<decltype(dc)::value>(); });
  // One block per (split, KV head, item). Two full waves of resident blocks: equal
  // blocks finish together, and a second wave hides the first one's pipeline fill.
  // Splits of fewer than 4 tiles would be mostly fill and merge.
  const uint32_t slots = std::max(per_sm, 1u) * static_cast<uint32_t>(std::max(sm_count, 1));
  const uint32_t base = s.n_kv_heads * n_items;
  uint32_t splits = std::max(2 * slots / base, 1u);
  splits = std::min(splits, (max_tokens + 4 * kTile - 1) / (4 * kTile));
  return std::clamp<uint32_t>(splits, 1, kMaxSplits);
}

cudaError_t launch_dense_mma(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  if (!dense_mma_supported(b.shape)) return e;
  const bool two_tiles = b.shape.group() > 8;
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (D == 64 || D == 128 || D == 256) {
      dispatch_dtype(b.shape.dtype, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
          e = two_tiles ? launch_typed<D, T, 2>(b, plan, ws, st) : launch_typed<D, T, 1>(b, plan, ws, st);
        }
      });
    }
  });
  return e;
}

}  // namespace ssa::cuda
