// Attention of the sparse rows (one q head over its own read set: sink, local,
// heavy list, sorted unique samples) for f16/bf16 and head dims 64, 128, 256.
// Same split rule, math and partial results ([m, l, acc[D]] per row and split,
// natural-log units, merged by merge_splits_kernel) as the kSparse path of
// attention_split_kernel in sparse_attention.cu, which keeps f32 and the other
// head dims.
//
// Why: a gathered row is only worth its bytes in flight. The register kernel holds
// 4 tokens per lane group and must first load the token id (heavy/sample list) and
// then the page pointer before it can even ask for the row, so each round trip
// moves little and the stage runs far below the copy bandwidth. Here K and V rows
// go through a kStages-deep cp.async ring in shared memory (16 KB of rows per stage,
// two stages in flight per block, four blocks per SM: more blocks with shallower
// rings keep more copies in flight per SM than fewer blocks with deeper ones),
// and the addresses are
// resolved ahead of the ring: for every stage one thread per token loads the token
// id two iterations before the rows are requested and the page pointer one
// iteration before, so neither dependent load sits on the copy path, and only
// those two values per token live in registers.
//
// Compute is small (one q head): lanes split D in groups of kTpr lanes
// (RowSplit<D>), each group takes kUnroll tokens of every stage and keeps its own
// online softmax; the groups merge by log-sum-exp in a fixed order at the end, so
// the result does not depend on thread timing.
#include <algorithm>
#include <type_traits>

#include "cp_async.cuh"
#include "device_util.cuh"
#include "head_dim.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 4;               // tokens per lane group per stage
constexpr int kStages = 3;               // K/V ring depth (kStages - 1 stages in flight)
constexpr int kSlots = kStages + 1;      // address ring: stages i .. i + kStages live at once

template <int D>
struct GatherShape {
  static constexpr int kEpt = RowSplit<D>::kEpt, kTpr = RowSplit<D>::kTpr;
  static constexpr int kGroups = kThreads / kTpr;
  static constexpr int kTile = kGroups * kUnroll;   // tokens per stage: 16 KB of K + V rows
  static constexpr int kChunks = D / 8;             // 16-byte chunks per row
  static constexpr int kStageElems = 2 * kTile * D; // K rows, then V rows (no padding:
                                                    // a group reads one contiguous row)
  static constexpr size_t kRingBytes = size_t{kStages} * kStageElems * 2;
  static constexpr size_t kMergeBytes = size_t{kGroups} * (D + 2) * sizeof(float);
  static constexpr size_t smem_bytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  static_assert(kEpt == 8, "one 16-byte chunk per lane and row");
  static_assert(kTile <= kThreads, "one resolving thread per token of a stage");
  static_assert((kTile * kChunks) % kThreads == 0, "whole copy rounds");
};

template <int D, typename T>
__global__ void __launch_bounds__(kThreads) sparse_gather_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
                                                                 uint32_t n_splits) {
  stage_begin();
  using S = GatherShape<D>;
  constexpr int kEpt = S::kEpt, kTpr = S::kTpr, kTile = S::kTile;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  T* ring = reinterpret_cast<T*>(smem_raw);
  __shared__ const T* s_row[kSlots][kTile];  // K row of each token (nullptr: past the end)
  __shared__ float s_bias[kSlots][kTile];    // log pi (0 unless sampled)

  const uint32_t item = blockIdx.z, h = blockIdx.y, split = blockIdx.x;
  const DecodeItem& it = b.item(item);
  if (item_idle(it)) return;  // a decode step that may not run (step_plan.h)
  const uint32_t kvh = h / b.shape.group();
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);  // attention row (partials)

  const ReadSet rs = row_read_set(b, ws, item, h);
  uint32_t p0, p1;
  split_range(rs.size(), n_splits, split, &p0, &p1);
  const uint32_t n_tiles = (p1 - p0 + kTile - 1) / kTile;

  const int tid = threadIdx.x;
  const int lane = tid % kTpr, grp = tid / kTpr;
  const uint32_t page_shift = b.shape.page_shift, page_mask = b.shape.page_tokens - 1;
  const size_t row_base = size_t{kvh} * b.shape.page_tokens;
  const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;
  const uint8_t* const* pages = it.kv_pages;

  // ---- address resolution: thread tid < kTile owns token tid of every stage ----
  // Token id and log pi of stage j's token (false past the split end).
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
    s_bias[j % kSlots][tid] = lp;
  };
  // In flight between iterations: page pointer of stage i + kStages (token a) and
  // token id of stage i + kStages + 1 (token b).
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

  // ---- K/V ring ----
  const uint64_t policy = l2_evict_first_policy();
  auto load_stage = [&](uint32_t j) {
    T* ks = ring + (j % kStages) * S::kStageElems;
    T* vs = ks + kTile * D;
#pragma unroll
    for (int k = 0; k < kTile * S::kChunks / kThreads; ++k) {
      const int c = k * kThreads + tid;
      const int r = c / S::kChunks, col = (c % S::kChunks) * 8;
      const T* kp = s_row[j % kSlots][r];
      const uint32_t bytes = kp ? 16u : 0u;
      // Past the end: the stage's first row (always a real one) as a readable,
      // aligned source; nothing is copied from it.
      if (!kp) kp = s_row[j % kSlots][0];
      cp_async16(ks + r * D + col, kp + col, bytes, policy);
      cp_async16(vs + r * D + col, kp + v_off + col, bytes, policy);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (static_cast<uint32_t>(j) < n_tiles) load_stage(j);
    cp_async_commit();  // one group per stage, empty or not, keeps the wait count fixed
  }

  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float q[kEpt], acc[kEpt];
  {
    const T* qh = static_cast<const T*>(it.q) + size_t{h} * D + lane * kEpt;
#pragma unroll
    for (int e = 0; e < kEpt; ++e) {
      q[e] = Elem<T>::load(qh + e) * scale;
      acc[e] = 0.f;
    }
  }
  float m = -INFINITY, l = 0.f;

  for (uint32_t i = 0; i < n_tiles; ++i) {
    cp_async_wait<kStages - 2>();  // stage i has landed (this thread's copies)
    __syncthreads();               // ... everyone's; stage i - 1 and its address slot are free
    if (i + kStages - 1 < n_tiles) load_stage(i + kStages - 1);
    cp_async_commit();
    if (tid < kTile) {
      // The page pointer loaded last iteration completes stage i + kStages's
      // addresses; then the next page pointer and token id are requested and only
      // consumed an iteration later, while this stage computes.
      publish(i + kStages, ok_a, pg_a, tok_a, lp_a);
      ok_a = ok_b;
      tok_a = tok_b;
      lp_a = lp_b;
      pg_a = fetch_page(ok_a, tok_a);
      ok_b = fetch_token(i + kStages + 2, tok_b, lp_b);
    }

    const T* ks = ring + (i % kStages) * S::kStageElems;
    const T* vs = ks + kTile * D;
    const float* bias = s_bias[i % kSlots];
    const uint32_t pbase = p0 + i * kTile;
    float s[kUnroll];
    float smax = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = u * S::kGroups + grp;
      float kr[kEpt];
      load8(ks + r * D + lane * kEpt, kr);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpt; ++e) dot = fmaf(q[e], kr[e], dot);
#pragma unroll
      for (int o = kTpr / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      s[u] = pbase + r < p1 ? dot - bias[r] : -INFINITY;
      smax = fmaxf(smax, s[u]);
    }
    if (smax == -INFINITY) continue;  // uniform per group; no shuffles follow
    const float corr = __expf(m - smax);
    l *= corr;
#pragma unroll
    for (int e = 0; e < kEpt; ++e) acc[e] *= corr;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = u * S::kGroups + grp;
      const float pw = __expf(s[u] - smax);  // 0 past the end (rows zero-filled)
      l += pw;
      float vr[kEpt];
      load8(vs + r * D + lane * kEpt, vr);
#pragma unroll
      for (int e = 0; e < kEpt; ++e) acc[e] = fmaf(pw, vr[e], acc[e]);
    }
    m = smax;
  }

  // Merge the groups in group order (the ring is free once every copy has landed
  // and every warp is past its last stage).
  cp_async_wait<0>();
  __syncthreads();
  float* mbuf = reinterpret_cast<float*>(smem_raw);  // [kGroups][D + 2]
  {
    float* slot = mbuf + grp * (D + 2);
    if (lane == 0) {
      slot[0] = m;
      slot[1] = l;
    }
#pragma unroll
    for (int e = 0; e < kEpt; ++e) slot[2 + lane * kEpt + e] = acc[e];
  }
  __syncthreads();
  float* out = ws.partial + (size_t{row} * n_splits + split) * (D + 2);
  for (int d = tid; d < D; d += kThreads) {
    float M = -INFINITY;
    for (int j = 0; j < S::kGroups; ++j) M = fmaxf(M, mbuf[j * (D + 2)]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
      for (int j = 0; j < S::kGroups; ++j) {
        const float* slot = mbuf + j * (D + 2);
        if (slot[0] == -INFINITY) continue;
        const float f = __expf(slot[0] - M);
        L += slot[1] * f;
        A += slot[2 + d] * f;
      }
    }
    if (d == 0) {
      out[0] = M;
      out[1] = L;
    }
    out[2 + d] = A;
  }
}

template <int D, typename T>
cudaError_t launch_typed(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                         cudaStream_t st) {
  const size_t smem = GatherShape<D>::smem_bytes;
  auto kernel = sparse_gather_kernel<D, T>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  return launch_stage(b, kernel, dim3(plan.n_splits, b.shape.n_q_heads, b.n_items), kThreads, smem, st, b,
                      ws, plan.n_splits);
}

template <int D>
uint32_t blocks_per_sm() {
  // 228 KB of shared memory per SM on sm_90, 1 KB of it reserved per block; the
  // address ring is static shared memory.
  constexpr size_t kStatic = size_t{kSlots} * GatherShape<D>::kTile * (sizeof(void*) + sizeof(float));
  return static_cast<uint32_t>((228 * 1024) / (GatherShape<D>::smem_bytes + kStatic + 1024));
}

}  // namespace

uint32_t sparse_gather_splits(const DecodeShape& s, uint32_t rows, uint32_t max_read, int sm_count) {
  uint32_t per_sm = 1;
  dispatch_head_dim(s.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (D == 64 || D == 128 || D == 256) per_sm = blocks_per_sm<D>();
  });
  // Blocks of a row are about equally long and the stage is bound by the copies in
  // flight, so a last wave that leaves SMs with fewer blocks runs slow: take the
  // fewest whole waves that rows x splits fills to 90% or more (more splits only
  // add merge work, and a partial last wave runs at the speed of its few blocks).
  const uint64_t slots = uint64_t{std::max(per_sm, 1u)} * static_cast<uint32_t>(std::max(sm_count, 1));
  uint64_t splits = 1;
  for (uint64_t w = 1; w <= 64; ++w) {
    const uint64_t n = w * slots / std::max(rows, 1u);
    if (n >= 1 && 10 * n * rows >= 9 * w * slots) {
      splits = n;
      break;
    }
  }
  // Splits of fewer than 64 read-set positions would be mostly pipeline fill.
  splits = std::min<uint64_t>(splits, (uint64_t{max_read} + 63) / 64);
  return static_cast<uint32_t>(std::clamp<uint64_t>(splits, 1, kMaxSplits));
}

bool sparse_gather_supported(const DecodeShape& s) {
  const bool dtype_ok = s.dtype == DType::kF16 || s.dtype == DType::kBF16;
  return dtype_ok && (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256);
}

cudaError_t launch_sparse_gather(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  if (!sparse_gather_supported(b.shape)) return e;
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (D == 64 || D == 128 || D == 256) {
      dispatch_dtype(b.shape.dtype, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) e = launch_typed<D, T>(b, plan, ws, st);
      });
    }
  });
  return e;
}

}  // namespace ssa::cuda
