// Sparse attention of a grouped decode (group selection, docs/GROUP_SELECTION.md)
// on tensor cores, f16 and bf16, head dims 64, 128 and 256, groups of 2 to 16 q
// heads. Same inputs and the same partial results ([m, l, acc[D]] per q row and
// split, natural-log units, merged by merge_splits_kernel) as the per-head kernels
// (sparse_gather_attention.cu, sparse_attention.cu), which keep per-head
// selection, groups of one head (bitwise the per-head decode) and what this
// kernel does not serve.
//
// Why: with group selection every q head of a KV group attends over the same
// read set (the group's sink, local, heavy list and samples) with the same log pi,
// only its own logits differ. A kernel per q head reads each selected row G times;
// here one block serves all G heads of a KV head over one split of that read set,
// so each K and V row is copied from memory once and used for G dot products and
// G accumulations, as the dense kernel (dense_attention_mma.cu) does for every row.
//
// Structure: the dense tensor-core kernel's (tokens as MMA rows, the group's
// heads as the 8 columns: S^T = K Q^T, O^T += V^T P^T; a cp.async ring of K/V
// tiles; kTokenGroups x kHeadTiles warps, each with its own online softmax, merged
// by log-sum-exp in a fixed order), with the rows gathered through the read set
// as the per-head gather kernel does: a stage's 64 rows are scattered over pages,
// so one thread per row resolves its token id two iterations before the rows are
// requested and its page pointer one iteration before, into a small ring of row
// addresses and log2 pi in shared memory; neither dependent load sits on the copy
// path. Logits are in base 2 with log2 pi subtracted per row (0 for sink, local
// and heavy rows); past the split's end they are -inf and the rows zero-filled.
// HT weights need nothing else: weight exp(s_j(t)) / pi(t) of head j is
// exp2(s_j(t) log2 e - log2 pi(t)).
//
// Shared memory per block (3 stages of K and V tiles, D + 8 elements a row) and
// blocks per SM on sm_90: D = 64: 54 KB (3/SM), D = 128: 102 KB (2/SM), D = 256:
// 198 KB (1/SM), plus 3 KB of row addresses; two stages (16-64 KB) in flight per
// block either way.
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
constexpr int kTile = 16 * kTokenGroups;  // read-set positions per pipeline stage
constexpr int kStages = 3;                // K/V ring depth (kStages - 1 stages in flight)
constexpr int kSlots = kStages + 1;       // address ring: stages i .. i + kStages live at once
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct GroupShape {
  // +16 bytes per shared-memory row: the 8 rows an ldmatrix reads start 4 banks
  // apart instead of on the same bank (a row pitch of a multiple of 128 B).
  static constexpr int kPitch = D + 8;
  static constexpr int kChunks = D / 8;                   // 16-byte chunks per row
  static constexpr int kStageElems = 2 * kTile * kPitch;  // K tile, then V tile
  static constexpr int kOutPitch = D + 4;                 // merge area: conflict-free fragment stores
  static constexpr size_t smem_bytes(int head_tiles) {
    const size_t ring = size_t{kStages} * kStageElems * 2;
    const size_t merge = size_t{kTokenGroups} * head_tiles * 8 * (kOutPitch + 2) * sizeof(float);
    return ring > merge ? ring : merge;
  }
  // The address ring (static shared memory).
  static constexpr size_t kStaticBytes = size_t{kSlots} * kTile * (sizeof(void*) + sizeof(float));
};

template <int D>
uint32_t blocks_per_sm() {
  // 228 KB of shared memory per SM on sm_90, 1 KB of it reserved per block.
  return static_cast<uint32_t>((228 * 1024) /
                               (GroupShape<D>::smem_bytes(1) + GroupShape<D>::kStaticBytes + 1024));
}

template <int D, typename T, int kHeadTiles>
__global__ void __launch_bounds__(kTokenGroups * kHeadTiles * 32)
    group_gather_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, uint32_t n_splits) {
  stage_begin();
  using S = GroupShape<D>;
  constexpr int kWarps = kTokenGroups * kHeadTiles, kThreads = kWarps * 32;
  constexpr int kP = S::kPitch;
  static_assert(kTile <= kThreads, "one resolving thread per row of a stage");
  static_assert((kTile * S::kChunks) % kThreads == 0, "whole copy rounds");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  T* ring = reinterpret_cast<T*>(smem_raw);
  __shared__ const T* s_row[kSlots][kTile];  // K row of each position (nullptr: past the end)
  __shared__ float s_bias[kSlots][kTile];    // log2 pi (0 unless sampled)

  const uint32_t item = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
  const DecodeItem& it = b.item(item);
  if (item_idle(it)) return;  // a decode step that may not run (step_plan.h)
  const uint32_t G = b.shape.group();
  // Every q head of the group attends with the group's selection row; its first
  // q head names it (row_read_set maps q heads to selection rows).
  const ReadSet rs = row_read_set(b, ws, item, kvh * G);
  uint32_t p0, p1;
  split_range(rs.size(), n_splits, split, &p0, &p1);
  const uint32_t n_tiles = (p1 - p0 + kTile - 1) / kTile;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int ht = warp % kHeadTiles, tg = warp / kHeadTiles;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t page_shift = b.shape.page_shift, page_mask = b.shape.page_tokens - 1;
  const size_t row_base = size_t{kvh} * b.shape.page_tokens;
  const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;
  const uint8_t* const* pages = it.kv_pages;

  // ---- address resolution: thread tid < kTile owns position tid of every stage ----
  auto fetch_token = [&](uint32_t j, uint32_t& tok, float& lp) {
    const uint32_t p = p0 + j * kTile + tid;
    lp = 0.f;
    tok = 0;
    if (p >= p1) return false;
    tok = rs.token(p, &lp);
    return true;
  };
  auto fetch_page = [&](bool ok, uint32_t tok) -> const uint8_t* {
    return ok ? pages[tok >> page_shift] : nullptr;
  };
  auto publish = [&](uint32_t j, bool ok, const uint8_t* pg, uint32_t tok, float lp) {
    s_row[j % kSlots][tid] =
        ok ? reinterpret_cast<const T*>(pg) + (row_base + (tok & page_mask)) * D : nullptr;
    s_bias[j % kSlots][tid] = lp * kLog2e;
  };
  // In flight between iterations: the page pointer of stage i + kStages (a) and
  // the token id of stage i + kStages + 1 (b).
  bool ok_a = false, ok_b = false;
  uint32_t tok_a = 0, tok_b = 0;
  float lp_a = 0.f, lp_b = 0.f;
  const uint8_t* pg_a = nullptr;
  if (tid < kTile) {
    uint32_t tk[kStages];
    float lp[kStages];
    bool ok[kStages];
#pragma unroll
    for (int j = 0; j < kStages; ++j) ok[j] = fetch_token(j, tk[j], lp[j]);
    ok_a = fetch_token(kStages, tok_a, lp_a);
    ok_b = fetch_token(kStages + 1, tok_b, lp_b);
    const uint8_t* pg[kStages];
#pragma unroll
    for (int j = 0; j < kStages; ++j) pg[j] = fetch_page(ok[j], tk[j]);
    pg_a = fetch_page(ok_a, tok_a);
#pragma unroll
    for (int j = 0; j < kStages; ++j) publish(j, ok[j], pg[j], tk[j], lp[j]);
  }
  __syncthreads();

  // ---- K/V ring: stage j's rows, 16-byte chunks, a row's chunks on consecutive threads ----
  const uint64_t policy = l2_evict_first_policy();
  auto load_stage = [&](uint32_t j) {
    T* ks = ring + (j % kStages) * S::kStageElems;
    T* vs = ks + kTile * kP;
    const T* const* rows = s_row[j % kSlots];
#pragma unroll
    for (int k = 0; k < kTile * S::kChunks / kThreads; ++k) {
      const int c = k * kThreads + tid;
      const int r = c / S::kChunks, col = (c % S::kChunks) * 8;
      const T* kp = rows[r];
      const uint32_t bytes = kp ? 16u : 0u;
      // Past the end: the stage's first row (always a real one: j < n_tiles) as a
      // readable, aligned source; nothing is copied from it.
      if (!kp) kp = rows[0];
      cp_async16(ks + r * kP + col, kp + col, bytes, policy);
      cp_async16(vs + r * kP + col, kp + v_off + col, bytes, policy);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (static_cast<uint32_t>(j) < n_tiles) load_stage(j);
    cp_async_commit();  // one group per stage, empty or not, keeps the wait count fixed
  }

  // q^T as B fragments (unscaled: the scale is applied to S in f32).
  uint32_t qf[D / 16][2];
  load_q_fragments<D>(static_cast<const T*>(it.q) + size_t{kvh} * G * D, G, ht, g, t4, qf);
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));

  // This thread's two heads (2 t4, 2 t4 + 1 of the head tile): running max (base 2)
  // and this thread's share of the sum (reduced over g at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 16][4];  // O^T: dims mt * 16 + g (+8), heads 2 t4 + {0, 1}
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  for (uint32_t i = 0; i < n_tiles; ++i) {
    cp_async_wait<kStages - 2>();  // stage i has landed (this thread's copies)
    __syncthreads();               // ... everyone's; stage i - 1 and its address slot are free
    if (i + kStages - 1 < n_tiles) load_stage(i + kStages - 1);
    cp_async_commit();
    if (tid < kTile) {
      // The page pointer loaded last iteration completes stage i + kStages's
      // addresses (slot of stage i - 1, read by no one any more); then the next
      // page pointer and token id are requested and only consumed an iteration
      // later, while this stage computes.
      publish(i + kStages, ok_a, pg_a, tok_a, lp_a);
      ok_a = ok_b;
      tok_a = tok_b;
      lp_a = lp_b;
      pg_a = fetch_page(ok_a, tok_a);
      ok_b = fetch_token(i + kStages + 2, tok_b, lp_b);
    }

    const T* ks = ring + (i % kStages) * S::kStageElems + tg * 16 * kP;
    const T* vs = ks + kTile * kP;
    const float* bias = s_bias[i % kSlots] + tg * 16;

    // S^T (16 rows x 8 heads) = K Q^T.
    float raw[4];
    tile_logits<D, kP>(ks, lane, qf, raw);
    // Rows g and g + 8 of this warp's 16; past the split end: -inf.
    const uint32_t pos = p0 + i * kTile + tg * 16 + g;
    float s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = g + (j >= 2 ? 8 : 0);
      const bool valid = pos + (j >= 2 ? 8u : 0u) < p1;
      s[j] = valid ? raw[j] * scale_log2 - bias[r] : -INFINITY;
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
  const size_t smem = GroupShape<D>::smem_bytes(kHeadTiles);
  auto kernel = group_gather_kernel<D, T, kHeadTiles>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  return launch_stage(b, kernel, dim3(plan.n_splits, b.shape.n_kv_heads, b.n_items),
                      kTokenGroups * kHeadTiles * 32, smem, st, b, ws, plan.n_splits);
}

}  // namespace

bool group_gather_supported(const DecodeShape& s) {
  const bool dtype_ok = s.dtype == DType::kF16 || s.dtype == DType::kBF16;
  const bool dim_ok = s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256;
  return dtype_ok && dim_ok && s.n_kv_heads > 0 && s.group() >= 2 && s.group() <= 16;
}

uint32_t group_gather_splits(const DecodeShape& s, uint32_t blocks, uint32_t max_read, int sm_count) {
  uint32_t per_sm = 1;
  dispatch_head_dim(s.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (D == 64 || D == 128 || D == 256) per_sm = blocks_per_sm<D>();
  });
  // The rule of sparse_gather_splits over one block per (KV head, item): blocks of
  // a split are about equally long and bound by the copies in flight, so take the
  // fewest whole waves that blocks x splits fills to 90% or more.
  const uint64_t slots = uint64_t{std::max(per_sm, 1u)} * static_cast<uint32_t>(std::max(sm_count, 1));
  uint64_t splits = 1;
  for (uint64_t w = 1; w <= 64; ++w) {
    const uint64_t n = w * slots / std::max(blocks, 1u);
    if (n >= 1 && 10 * n * blocks >= 9 * w * slots) {
      splits = n;
      break;
    }
  }
  // Splits of fewer than two stages would be mostly pipeline fill and merge.
  splits = std::min<uint64_t>(splits, (uint64_t{max_read} + 2 * kTile - 1) / (2 * kTile));
  return static_cast<uint32_t>(std::clamp<uint64_t>(splits, 1, kMaxSplits));
}

cudaError_t launch_group_gather(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  if (!b.grouped() || !group_gather_supported(b.shape)) return e;
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
