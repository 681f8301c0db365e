// The PQ index on the GPU: encoding keys of device pages into code pages (nearest
// centroid per subspace), and training codebooks by k-means (Lloyd iterations
// from k-means++ seeds the host computes) over keys sampled evenly from the layer. One block serves one (KV head,
// subspace) codebook, kept in shared memory, and a tile of keys.
#include "device_util.cuh"
#include "head_dim.cuh"
#include "pq_index.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ float key_elem(const PqIndexShape& s, const uint8_t* const* kv_pages, uint32_t t,
                          uint32_t h, uint32_t j) {
  const T* k = reinterpret_cast<const T*>(kv_pages[t >> s.page_shift]) +
               (size_t{h} * s.page_tokens + (t & (s.page_tokens - 1))) * s.head_dim;
  return Elem<T>::load(k + j);
}

// Nearest centroid of x (sub floats) among K in shared memory; lowest index on ties.
__device__ uint32_t nearest(const float* cent, uint32_t K, uint32_t sub, const float* x) {
  float best = INFINITY;
  uint32_t bc = 0;
  for (uint32_t c = 0; c < K; ++c) {
    const float* cc = cent + size_t{c} * sub;
    float dist = 0.f;
    for (uint32_t j = 0; j < sub; ++j) {
      const float df = x[j] - cc[j];
      dist = fmaf(df, df, dist);
    }
    if (dist < best) {
      best = dist;
      bc = c;
    }
  }
  return bc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) encode_kernel(PqIndexShape s, const uint8_t* const* kv_pages,
                                                          uint8_t* const* code_pages, const float* books,
                                                          uint32_t begin, uint32_t end) {
  extern __shared__ float cent[];  // [K][sub]
  const uint32_t m = blockIdx.y, h = blockIdx.z, sub = s.head_dim / s.subspaces;
  const float* src = books + (size_t{h} * s.subspaces + m) * s.centroids * sub;
  for (uint32_t i = threadIdx.x; i < s.centroids * sub; i += kThreads) cent[i] = src[i];
  __syncthreads();
  const uint32_t t = begin + blockIdx.x * kThreads + threadIdx.x;
  if (t >= end) return;
  float x[64];
  for (uint32_t j = 0; j < sub; ++j) x[j] = key_elem<T>(s, kv_pages, t, h, m * sub + j);
  const uint32_t c = nearest(cent, s.centroids, sub, x);
  code_pages[t >> s.page_shift][(size_t{h} * s.subspaces + m) * s.page_tokens + (t & (s.page_tokens - 1))] =
      static_cast<uint8_t>(c);
}

// Copies the keys of `n` evenly spaced tokens into x[n_kv][n][head_dim] floats.
template <typename T>
__global__ void gather_kernel(PqIndexShape s, const uint8_t* const* kv_pages, uint32_t n_tokens,
                              uint32_t n, float* x) {
  const uint32_t i = blockIdx.x, h = blockIdx.y;
  const uint32_t t = static_cast<uint32_t>((uint64_t{i} * n_tokens) / n);
  for (uint32_t j = threadIdx.x; j < s.head_dim; j += blockDim.x)
    x[(size_t{h} * n + i) * s.head_dim + j] = key_elem<T>(s, kv_pages, t, h, j);
}

// One Lloyd assignment step: sums and counts of the points nearest each centroid.
__global__ void __launch_bounds__(kThreads) assign_kernel(PqIndexShape s, const float* x, uint32_t n,
                                                          const float* books, float* sums, uint32_t* counts) {
  extern __shared__ float cent[];
  const uint32_t m = blockIdx.y, h = blockIdx.z, sub = s.head_dim / s.subspaces;
  const size_t cb = (size_t{h} * s.subspaces + m) * s.centroids;
  for (uint32_t i = threadIdx.x; i < s.centroids * sub; i += kThreads) cent[i] = books[cb * sub + i];
  __syncthreads();
  const uint32_t i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= n) return;
  const float* p = x + (size_t{h} * n + i) * s.head_dim + m * sub;
  const uint32_t c = nearest(cent, s.centroids, sub, p);
  atomicAdd(&counts[cb + c], 1u);
  for (uint32_t j = 0; j < sub; ++j) atomicAdd(&sums[(cb + c) * sub + j], p[j]);
}

// Centroid = mean of its points; an empty cluster keeps its centroid.
__global__ void update_kernel(PqIndexShape s, const float* sums, const uint32_t* counts, float* books,
                              size_t n_centroids) {
  const uint32_t sub = s.head_dim / s.subspaces;
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_centroids * sub) return;
  const uint32_t cnt = counts[i / sub];
  if (cnt) books[i] = sums[i] / static_cast<float>(cnt);
}

template <typename F>
cudaError_t with_dtype(DType t, F&& f) {
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_dtype(t, [&](auto v) { e = f(v); });
  return e;
}

}  // namespace

cudaError_t pq_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                      const float* books, uint32_t begin, uint32_t end, cudaStream_t st) {
  if (end <= begin) return cudaSuccess;
  if (s.head_dim / s.subspaces > 64) return cudaErrorInvalidValue;
  const size_t smem = size_t{s.centroids} * (s.head_dim / s.subspaces) * sizeof(float);
  return with_dtype(s.dtype, [&](auto v) {
    using T = decltype(v);
    cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(encode_kernel<T>), smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((end - begin + kThreads - 1) / kThreads, s.subspaces, s.n_kv_heads);
    encode_kernel<T><<<grid, kThreads, smem, st>>>(s, kv_pages, code_pages, books, begin, end);
    return cudaGetLastError();
  });
}

size_t kmeans_workspace_bytes(const PqIndexShape& s, uint32_t n) {
  const size_t nc = size_t{s.n_kv_heads} * s.subspaces * s.centroids;
  return size_t{s.n_kv_heads} * n * s.head_dim * 4 + nc * (s.head_dim / s.subspaces) * 4 + nc * 4 + 1024;
}

cudaError_t pq_gather_sample(const PqIndexShape& s, const uint8_t* const* kv_pages, uint32_t n_tokens,
                             uint32_t n, void* workspace, cudaStream_t st) {
  if (n == 0 || s.head_dim / s.subspaces > 64) return cudaErrorInvalidValue;
  float* x = static_cast<float*>(workspace);
  return with_dtype(s.dtype, [&](auto v) {
    using T = decltype(v);
    gather_kernel<T><<<dim3(n, s.n_kv_heads), 128, 0, st>>>(s, kv_pages, n_tokens, n, x);
    return cudaGetLastError();
  });
}

cudaError_t pq_lloyd(const PqIndexShape& s, uint32_t n, uint32_t iterations, void* workspace,
                     float* books, cudaStream_t st) {
  if (n == 0 || s.head_dim / s.subspaces > 64) return cudaErrorInvalidValue;
  const uint32_t sub = s.head_dim / s.subspaces;
  const size_t nc = size_t{s.n_kv_heads} * s.subspaces * s.centroids;
  float* x = static_cast<float*>(workspace);
  float* sums = x + size_t{s.n_kv_heads} * n * s.head_dim;
  uint32_t* counts = reinterpret_cast<uint32_t*>(sums + nc * sub);
  cudaError_t e;
  const size_t smem = size_t{s.centroids} * sub * sizeof(float);
  if ((e = ensure_dynamic_smem(reinterpret_cast<const void*>(assign_kernel), smem)) != cudaSuccess)
    return e;
  for (uint32_t it = 0; it < iterations; ++it) {
    if ((e = cudaMemsetAsync(sums, 0, nc * sub * 4 + nc * 4, st)) != cudaSuccess) return e;
    assign_kernel<<<dim3((n + kThreads - 1) / kThreads, s.subspaces, s.n_kv_heads), kThreads, smem, st>>>(
        s, x, n, books, sums, counts);
    update_kernel<<<static_cast<uint32_t>((nc * sub + 255) / 256), 256, 0, st>>>(s, sums, counts, books, nc);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ssa::cuda
