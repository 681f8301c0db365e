// Dense decode over the paged cache, streamed through shared memory. A block owns
// one KV head, the GH q heads of its GQA group that read it, and a contiguous
// token range (a split, aligned to 16 tokens so a stage never crosses a page).
// The K and V rows of 16 tokens of one head are two contiguous runs of a page;
// they are copied with cp.async into a ring of kStages buffers, so several stages
// are in flight while the block computes on the oldest one. Compute is the same
// online softmax as sparse_attention.cu (groups of TPR lanes, one token at a
// time), and the block writes one log-sum-exp partial per q head for the merge.
#include "device_util.cuh"
#include "head_dim.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kStageTokens = 16;
constexpr int kStages = 4;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int D, typename T, int GH>
__global__ void __launch_bounds__(kThreads) dense_stream_kernel(DecodeBatch b, Workspace ws, uint32_t n_splits) {
  using RS = RowSplit<D>;
  constexpr int kEpt = RS::kEpt, kTpr = RS::kTpr, kGroups = kThreads / kTpr;
  constexpr int kRowBytes = D * static_cast<int>(sizeof(T));
  constexpr int kRunBytes = kStageTokens * kRowBytes;  // K (or V) of one stage
  constexpr int kChunks = 2 * kRunBytes / 16;          // 16-byte copies per stage
  extern __shared__ __align__(16) uint8_t smem[];      // [kStages][K run, V run]

  const uint32_t item = blockIdx.z, split = blockIdx.x;
  const DecodeItem& it = b.items[item];
  const uint32_t G = b.shape.group(), chunks = G / GH;
  const uint32_t kvh = blockIdx.y / chunks;
  const uint32_t h0 = kvh * G + (blockIdx.y % chunks) * GH;
  const uint32_t row0 = row_of(item, h0, b.shape.n_q_heads);
  const uint32_t N = it.n_tokens;
  uint32_t per = (N + n_splits - 1) / n_splits;
  per = (per + kStageTokens - 1) / kStageTokens * kStageTokens;
  const uint32_t p0 = min(N, split * per), p1 = min(N, p0 + per);
  const uint32_t n_stage = (p1 - p0 + kStageTokens - 1) / kStageTokens;
  const uint32_t page_mask = b.shape.page_tokens - 1;
  const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;

  auto issue = [&](uint32_t st) {
    if (st < n_stage) {
      const uint32_t t0 = p0 + st * kStageTokens;
      const T* kbase = reinterpret_cast<const T*>(it.kv_pages[t0 >> b.shape.page_shift]) +
                       (size_t{kvh} * b.shape.page_tokens + (t0 & page_mask)) * D;
      const uint8_t* kb = reinterpret_cast<const uint8_t*>(kbase);
      const uint8_t* vb = reinterpret_cast<const uint8_t*>(kbase + v_off);
      uint8_t* dst = smem + static_cast<size_t>(st % kStages) * 2 * kRunBytes;
      const uint32_t valid_bytes = min(p1 - t0, static_cast<uint32_t>(kStageTokens)) * kRowBytes;
      for (int c = threadIdx.x; c < kChunks; c += kThreads) {
        const uint32_t off = static_cast<uint32_t>(c) * 16;
        const bool is_v = off >= static_cast<uint32_t>(kRunBytes);
        const uint32_t in_run = is_v ? off - kRunBytes : off;
        if (in_run < valid_bytes) cp_async16(dst + off, (is_v ? vb : kb) + in_run);
      }
    }
    cp_async_commit();  // possibly empty: keeps the group count uniform
  };

  const int lane = threadIdx.x % kTpr, grp = threadIdx.x / kTpr;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float q[GH][kEpt], acc[GH][kEpt], m[GH], l[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    const T* qg = static_cast<const T*>(it.q) + static_cast<size_t>(h0 + g) * D + lane * kEpt;
#pragma unroll
    for (int e = 0; e < kEpt; ++e) {
      q[g][e] = Elem<T>::load(qg + e) * scale;
      acc[g][e] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (uint32_t st = 0; st < n_stage; ++st) {
    issue(st + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const uint8_t* buf = smem + static_cast<size_t>(st % kStages) * 2 * kRunBytes;
    const uint32_t t0 = p0 + st * kStageTokens;
    // Every lane runs the same trip count (shuffles); tokens past p1 weigh 0.
    for (int i = grp; i < kStageTokens; i += kGroups) {
      const bool valid = t0 + i < p1;
      float kr[kEpt], vr[kEpt];
      if (valid) {
        const T* kp = reinterpret_cast<const T*>(buf + i * kRowBytes) + lane * kEpt;
        const T* vp = reinterpret_cast<const T*>(buf + kRunBytes + i * kRowBytes) + lane * kEpt;
#pragma unroll
        for (int e = 0; e < kEpt; e += 8) {
          load8(kp + e, kr + e);
          load8(vp + e, vr + e);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kEpt; ++e) kr[e] = vr[e] = 0.f;
      }
#pragma unroll
      for (int g = 0; g < GH; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kEpt; ++e) dot = fmaf(q[g][e], kr[e], dot);
#pragma unroll
        for (int o = kTpr / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (!valid) continue;
        const float mn = fmaxf(m[g], dot);
        const float corr = __expf(m[g] - mn), pw = __expf(dot - mn);
        l[g] = l[g] * corr + pw;
#pragma unroll
        for (int e = 0; e < kEpt; ++e) acc[g][e] = fmaf(pw, vr[e], acc[g][e] * corr);
        m[g] = mn;
      }
    }
    __syncthreads();  // the buffer is refilled by the next issue
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the groups of the block (the stage buffers are free now).
  float* red = reinterpret_cast<float*>(smem);  // [kGroups][GH][D + 2]
  float* mine = red + static_cast<size_t>(grp) * GH * (D + 2);
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
    for (int j = 0; j < kGroups; ++j) M = fmaxf(M, red[(static_cast<size_t>(j) * GH + g) * (D + 2)]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
      for (int j = 0; j < kGroups; ++j) {
        const float* slot = red + (static_cast<size_t>(j) * GH + g) * (D + 2);
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

template <int D, typename T, int GH>
cudaError_t launch_gh(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws, cudaStream_t st) {
  constexpr int kGroups = kThreads / RowSplit<D>::kTpr;
  const size_t pipe = size_t{kStages} * 2 * kStageTokens * D * sizeof(T);
  const size_t red = size_t{kGroups} * GH * (D + 2) * sizeof(float);
  const size_t smem = pipe > red ? pipe : red;
  auto kernel = dense_stream_kernel<D, T, GH>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(plan.n_splits, b.shape.n_kv_heads * (b.shape.group() / GH), b.n_items);
  kernel<<<grid, kThreads, smem, st>>>(b, ws, plan.n_splits);
  return cudaGetLastError();
}

}  // namespace

bool dense_stream_supported(const DecodeShape& s) {
  // Stage buffers of 2-byte rows up to 256 elements (4 stages: at most 64 KiB).
  return s.dtype != DType::kF32 && s.head_dim <= 256 && head_dim_supported(s.head_dim) &&
         s.page_tokens >= kStageTokens;
}

cudaError_t launch_dense_stream(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  const uint32_t gh = dense_heads_per_block(b.shape.group());
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (D <= 256) {
      auto go = [&](auto t) {
        using T = decltype(t);
        if (gh == 8) e = launch_gh<D, T, 8>(b, plan, ws, st);
        else if (gh == 4) e = launch_gh<D, T, 4>(b, plan, ws, st);
        else if (gh == 2) e = launch_gh<D, T, 2>(b, plan, ws, st);
        else e = launch_gh<D, T, 1>(b, plan, ws, st);
      };
      if (b.shape.dtype == DType::kF16) go(__half{});
      else if (b.shape.dtype == DType::kBF16) go(__nv_bfloat16{});
    }
  });
  return e;
}

}  // namespace ssa::cuda
