// The merge of a row's split partials into its output: one block per row; the
// per-split scale exp(m_s - M) / L is computed once into shared memory, then
// each thread sums its dimensions over the splits (independent, coalesced loads).
#include "device_util.cuh"
#include "head_dim.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(256) merge_splits_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, uint32_t n_splits) {
  stage_begin();
  __shared__ float scale[kMaxSplits];
  __shared__ float red[256 / 32];
  const uint32_t item = blockIdx.y, h = blockIdx.x;
  const DecodeItem& it = b.item(item);
  if (item_idle(it)) return;  // a decode step that may not run (step_plan.h)
  const uint32_t D = b.shape.head_dim;
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  const float* part = ws.partial + size_t{row} * n_splits * (D + 2);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  // M = max over splits.
  float mx = -INFINITY;
  for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) mx = fmaxf(mx, part[size_t{s} * (D + 2)]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (uint32_t w = 0; w < blockDim.x / 32; ++w) M = fmaxf(M, red[w]);
  __syncthreads();
  // L = sum l_s exp(m_s - M); scale_s = exp(m_s - M).
  float l = 0.f;
  for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float ms = part[size_t{s} * (D + 2)];
    const float f = ms == -INFINITY ? 0.f : __expf(ms - M);
    scale[s] = f;
    l += f * part[size_t{s} * (D + 2) + 1];
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float L = 0.f;
  for (uint32_t w = 0; w < blockDim.x / 32; ++w) L += red[w];
  const float inv = L > 0.f ? 1.f / L : 0.f;
  T* out = static_cast<T*>(it.out) + size_t{h} * D;
  for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
    float A = 0.f;
#pragma unroll 8
    for (uint32_t s = 0; s < n_splits; ++s) A = fmaf(part[size_t{s} * (D + 2) + 2 + d], scale[s], A);
    Elem<T>::store(out + d, A * inv);
  }
}

}  // namespace

cudaError_t launch_merge_splits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_dtype(b.shape.dtype, [&](auto t) {
    using T = decltype(t);
    e = launch_stage(b, merge_splits_kernel<T>, dim3(b.shape.n_q_heads, b.n_items), 256, 0, st, b, ws,
                     plan.n_splits);
  });
  return e;
}

}  // namespace ssa::cuda
