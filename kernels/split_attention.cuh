// The split-K attention kernel on CUDA cores, for sparse rows
// (sparse_attention.cu) and dense rows (dense_attention.cu): each row's read set
// is cut into n_splits contiguous ranges, one thread block each; a block's lanes
// form groups of TPR lanes, one token per group at a time, each lane holding EPT
// elements of q, k, v and the accumulator. Every group keeps an online softmax
// (running max, sum, weighted V); the groups of a block merge by log-sum-exp
// into the row's partial for its split (common/online_softmax.h semantics), and
// attention_merge.cu merges the splits, so the result does not depend on how
// the work was cut.
//   sparse rows: read set = sink, local, heavy list, sorted unique samples;
//     a sampled token's logit has log(pi) subtracted (log pi computed per unique
//     sample by the sampler, kernels/stratified_sample.cu). GH = 1: one q head
//     per block over its own read set; GH > 1 (group selection only, where the
//     q heads of a KV group share their group's read set): GH q heads of one
//     group per block, each row read once for all of them.
//   dense (GH q heads of one KV head per block): every token, each K/V row read
//     once for all GH heads of the GQA group.
#pragma once

#include "device_util.cuh"
#include "head_dim.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda::split_attention {

constexpr int kThreads = 128;

template <int D, typename T, int GH, bool kSparse>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
                                                                   uint32_t n_splits) {
  stage_begin();
  using RS = RowSplit<D>;
  constexpr int kEpt = RS::kEpt, kTpr = RS::kTpr, kGroups = kThreads / kTpr;
  constexpr int kUnroll = GH >= 4 ? 2 : 4;
  extern __shared__ float smem[];  // [kGroups][GH][D + 2]

  const uint32_t item = blockIdx.z, split = blockIdx.x;
  const DecodeItem& it = b.item(item);
  if (item_idle(it)) return;  // a decode step that may not run (step_plan.h)
  const uint32_t G = b.shape.group();
  uint32_t h0, kvh;
  if constexpr (kSparse && GH == 1) {
    h0 = blockIdx.y;
    kvh = h0 / G;
  } else {
    const uint32_t chunks = G / GH;
    kvh = blockIdx.y / chunks;
    h0 = kvh * G + (blockIdx.y % chunks) * GH;
  }
  const uint32_t row0 = row_of(item, h0, b.shape.n_q_heads);  // attention row (partials)

  const ReadSet rs = kSparse ? row_read_set(b, ws, item, h0)
                             : ReadSet{it.n_tokens - it.first_token, it.n_tokens, 0, 0, 0, nullptr, nullptr,
                                       nullptr, it.first_token};
  uint32_t p0, p1;
  split_range(rs.size(), n_splits, split, &p0, &p1);

  const int lane = threadIdx.x % kTpr, grp = threadIdx.x / kTpr;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float q[GH][kEpt], acc[GH][kEpt], m[GH], l[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    const T* qg = static_cast<const T*>(it.q) + size_t{h0 + g} * D + lane * kEpt;
#pragma unroll
    for (int e = 0; e < kEpt; ++e) {
      q[g][e] = Elem<T>::load(qg + e) * scale;
      acc[g][e] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  const uint32_t page_mask = b.shape.page_tokens - 1;
  const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;

  // The loop bounds are the same for every lane of a warp (shuffles below).
  for (uint32_t pb = p0; pb < p1; pb += kGroups * kUnroll) {
    if constexpr (!kSparse) {
      // Dense rows are contiguous: ask L2 for the rows kPrefetch iterations ahead,
      // more bytes in flight than the registers alone can hold.
      constexpr uint32_t kPrefetch = 4;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t t = pb + kPrefetch * kGroups * kUnroll + grp + u * kGroups;
        if (t < p1) {
          const T* kp = reinterpret_cast<const T*>(it.kv_pages[t >> b.shape.page_shift]) +
                        (size_t{kvh} * b.shape.page_tokens + (t & page_mask)) * D + lane * kEpt;
          asm volatile("prefetch.global.L2 [%0];" ::"l"(kp));
          asm volatile("prefetch.global.L2 [%0];" ::"l"(kp + v_off));
        }
      }
    }
    float kr[kUnroll][kEpt], vr[kUnroll][kEpt], bias[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t p = pb + grp + u * kGroups;
      valid[u] = p < p1;
      bias[u] = 0.f;
      if (valid[u]) {
        const uint32_t t = rs.token(p, &bias[u]);
        const T* kp = reinterpret_cast<const T*>(it.kv_pages[t >> b.shape.page_shift]) +
                      (size_t{kvh} * b.shape.page_tokens + (t & page_mask)) * D + lane * kEpt;
#pragma unroll
        for (int e = 0; e < kEpt; e += 8) {
          load8(kp + e, kr[u] + e);
          load8(kp + v_off + e, vr[u] + e);
        }
      } else {
        // Past the end: zero rows, so 0-weight terms stay 0 (never 0 * garbage).
#pragma unroll
        for (int e = 0; e < kEpt; ++e) kr[u][e] = vr[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int g = 0; g < GH; ++g) {
      float s[kUnroll];
      float smax = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kEpt; ++e) dot = fmaf(q[g][e], kr[u][e], dot);
#pragma unroll
        for (int o = kTpr / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u] = valid[u] ? dot - bias[u] : -INFINITY;
        smax = fmaxf(smax, s[u]);
      }
      if (smax == -INFINITY) continue;
      const float corr = __expf(m[g] - smax);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < kEpt; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float pw = __expf(s[u] - smax);
        l[g] += pw;
#pragma unroll
        for (int e = 0; e < kEpt; ++e) acc[g][e] = fmaf(pw, vr[u][e], acc[g][e]);
      }
      m[g] = smax;
    }
  }

  // Merge the groups of the block.
  float* mine = smem + static_cast<size_t>(grp) * GH * (D + 2);
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    float* slot = mine + g * (D + 2);
    if (lane == 0) {
      slot[0] = m[g];
      slot[1] = l[g];
    }
#pragma unroll
    for (int e = 0; e < kEpt; ++e) slot[2 + lane * kEpt + e] = acc[g][e];
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < GH * D; i += kThreads) {
    const uint32_t g = i / D, d = i % D;
    float M = -INFINITY;
    for (int j = 0; j < kGroups; ++j) M = fmaxf(M, smem[(static_cast<size_t>(j) * GH + g) * (D + 2)]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
      for (int j = 0; j < kGroups; ++j) {
        const float* slot = smem + (static_cast<size_t>(j) * GH + g) * (D + 2);
        if (slot[0] == -INFINITY) continue;
        const float f = __expf(slot[0] - M);
        L += slot[1] * f;
        A += slot[2 + d] * f;
      }
    }
    float* out = ws.partial + (size_t{row0 + g} * n_splits + split) * (D + 2);
    if (d == 0) {
      out[0] = M;
      out[1] = L;
    }
    out[2 + d] = A;
  }
}

template <int D, typename T, int GH, bool kSparse>
cudaError_t launch_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                         cudaStream_t st) {
  constexpr int kGroups = kThreads / RowSplit<D>::kTpr;
  const size_t smem = size_t{kGroups} * GH * (D + 2) * sizeof(float);
  auto kernel = attention_split_kernel<D, T, GH, kSparse>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  const uint32_t ys = kSparse && GH == 1 ? b.shape.n_q_heads : b.shape.n_kv_heads * (b.shape.group() / GH);
  return launch_stage(b, kernel, dim3(plan.n_splits, ys, b.n_items), kThreads, smem, st, b, ws,
                      plan.n_splits);
}

}  // namespace ssa::cuda::split_attention
