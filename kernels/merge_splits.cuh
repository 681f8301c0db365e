// Merge of one row's split-K partials ([m, l, acc[D]] per split, natural-log
// units): O = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, M = max_s m_s.
// Run by all threads of one block; reads the partials in split order, so the
// result does not depend on which block runs it. Partials written by other blocks
// of the same launch are read from L2 (__ldcg).
#pragma once

#include "device_util.cuh"

namespace ssa::cuda {

// scale: n_splits floats, red: 32 floats, both shared memory.
template <typename T>
__device__ void merge_row_splits(const float* part, uint32_t n_splits, uint32_t D, float* scale,
                                 float* red, T* out) {
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;
  float mx = -INFINITY;
  for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) mx = fmaxf(mx, __ldcg(part + size_t{s} * (D + 2)));
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (uint32_t w = 0; w < warps; ++w) M = fmaxf(M, red[w]);
  __syncthreads();
  // L = sum l_s exp(m_s - M); scale_s = exp(m_s - M).
  float l = 0.f;
  for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float ms = __ldcg(part + size_t{s} * (D + 2));
    const float f = ms == -INFINITY ? 0.f : __expf(ms - M);
    scale[s] = f;
    l += f * __ldcg(part + size_t{s} * (D + 2) + 1);
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float L = 0.f;
  for (uint32_t w = 0; w < warps; ++w) L += red[w];
  const float inv = L > 0.f ? 1.f / L : 0.f;
  for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
    float A = 0.f;
#pragma unroll 8
    for (uint32_t s = 0; s < n_splits; ++s) A = fmaf(__ldcg(part + size_t{s} * (D + 2) + 2 + d), scale[s], A);
    Elem<T>::store(out + d, A * inv);
  }
}

}  // namespace ssa::cuda
