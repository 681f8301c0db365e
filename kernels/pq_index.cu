// The PQ index on the GPU: encoding keys of device pages into code pages (nearest
// centroid per subspace), and training codebooks by k-means (Lloyd iterations
// from k-means++ seeds the host computes) over keys sampled evenly from the layer. One block serves one (KV head,
// subspace) codebook, kept in shared memory, and a tile of keys.
#include "device_util.cuh"
#include "head_dim.cuh"
#include "index/kmeans_rng.h"
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
                                                          uint32_t begin, uint32_t end, const uint32_t* begin_dev) {
  // A decode step's token: its position is read here (kNoPosition: nothing to encode).
  if (begin_dev != nullptr) {
    begin = *begin_dev;
    if (begin == 0xFFFFFFFFu) return;
    end = begin + 1;
  }
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

// One Lloyd assignment step: the nearest centroid of each sample point, per
// (KV head, subspace): assign[h][m][n].
__global__ void __launch_bounds__(kThreads) assign_kernel(PqIndexShape s, const float* x, uint32_t n,
                                                          const float* books, uint8_t* assign) {
  extern __shared__ float cent[];
  const uint32_t m = blockIdx.y, h = blockIdx.z, sub = s.head_dim / s.subspaces;
  const size_t cb = (size_t{h} * s.subspaces + m) * s.centroids;
  for (uint32_t i = threadIdx.x; i < s.centroids * sub; i += kThreads) cent[i] = books[cb * sub + i];
  __syncthreads();
  const uint32_t i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= n) return;
  const float* p = x + (size_t{h} * n + i) * s.head_dim + m * sub;
  assign[(size_t{h} * s.subspaces + m) * n + i] = static_cast<uint8_t>(nearest(cent, s.centroids, sub, p));
}

// Centroid = mean of its points, without atomics, so that training gives the same
// codebooks in every run: one block per (subspace, KV head), thread c owns
// centroid c and adds the points assigned to it in point order, in double (as
// the CPU's k-means sums). The assignments pass through shared memory a tile at a
// time, every thread reading each entry (a broadcast). An empty cluster restarts
// at a random sample point, the one the CPU's k-means picks: restarts are drawn
// in centroid order from the codebook's stream, continuing across iterations
// (`restarts` counts each codebook's draws so far).
constexpr uint32_t kAssignTile = 8192;
constexpr uint32_t kMaxSubDim = 64;
constexpr uint32_t kMaxCentroids = 256;
__global__ void update_kernel(PqIndexShape s, const float* x, uint32_t n, const uint8_t* assign,
                              float* books, uint32_t* restarts) {
  __shared__ uint8_t a_s[kAssignTile];
  __shared__ uint8_t empty_s[kMaxCentroids];
  const uint32_t m = blockIdx.x, h = blockIdx.y, c = threadIdx.x, sub = s.head_dim / s.subspaces;
  const uint32_t hm = h * s.subspaces + m;
  const uint8_t* a = assign + size_t{hm} * n;
  double sum[kMaxSubDim];
  for (uint32_t j = 0; j < sub; ++j) sum[j] = 0.0;
  uint32_t count = 0;
  for (uint32_t i0 = 0; i0 < n; i0 += kAssignTile) {
    const uint32_t len = min(kAssignTile, n - i0);
    __syncthreads();  // the previous tile has been read
    for (uint32_t i = threadIdx.x; i < len; i += blockDim.x) a_s[i] = a[i0 + i];
    __syncthreads();
    for (uint32_t i = 0; i < len; ++i) {
      if (a_s[i] != c) continue;
      const float* p = x + (size_t{h} * n + i0 + i) * s.head_dim + m * sub;
      for (uint32_t j = 0; j < sub; ++j) sum[j] += p[j];
      ++count;
    }
  }
  float* cen = books + (size_t{hm} * s.centroids + c) * sub;
  empty_s[c] = count == 0;
  const uint32_t drawn = restarts[hm];
  __syncthreads();
  if (count == 0) {
    uint32_t rank = 0;  // empty clusters before this one
    for (uint32_t e = 0; e < c; ++e) rank += empty_s[e];
    const uint64_t pick = kmeans_restart_point(kmeans_stream(codebook_seed(h, m, s.subspaces)),
                                               drawn + rank, n);
    const float* p = x + (size_t{h} * n + pick) * s.head_dim + m * sub;
    for (uint32_t j = 0; j < sub; ++j) cen[j] = p[j];
  }
  if (c == 0) {
    uint32_t total = 0;
    for (uint32_t e = 0; e < blockDim.x; ++e) total += empty_s[e];
    restarts[hm] = drawn + total;
  }
  if (count == 0) return;
  const double inv = 1.0 / count;
  for (uint32_t j = 0; j < sub; ++j) cen[j] = static_cast<float>(sum[j] * inv);
}

template <typename F>
cudaError_t with_dtype(DType t, F&& f) {
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_dtype(t, [&](auto v) { e = f(v); });
  return e;
}

}  // namespace

namespace {
cudaError_t launch_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                          const float* books, uint32_t begin, uint32_t end, const uint32_t* begin_dev,
                          cudaStream_t st) {
  if (s.head_dim / s.subspaces > 64) return cudaErrorInvalidValue;
  const size_t smem = size_t{s.centroids} * (s.head_dim / s.subspaces) * sizeof(float);
  return with_dtype(s.dtype, [&](auto v) {
    using T = decltype(v);
    cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(encode_kernel<T>), smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((end - begin + kThreads - 1) / kThreads, s.subspaces, s.n_kv_heads);
    encode_kernel<T><<<grid, kThreads, smem, st>>>(s, kv_pages, code_pages, books, begin, end, begin_dev);
    return cudaGetLastError();
  });
}
}  // namespace

cudaError_t pq_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                      const float* books, uint32_t begin, uint32_t end, cudaStream_t st) {
  if (end <= begin) return cudaSuccess;
  return launch_encode(s, kv_pages, code_pages, books, begin, end, nullptr, st);
}

cudaError_t pq_encode_at(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                         const float* books, const uint32_t* position, cudaStream_t st) {
  return launch_encode(s, kv_pages, code_pages, books, 0, 1, position, st);
}

namespace {
// The k-means workspace: the sample points (floats), each codebook's count of
// restart draws, then the points' assignments (one byte each per subspace).
struct KmeansWorkspace {
  float* x;
  uint32_t* restarts;
  uint8_t* assign;
};
KmeansWorkspace kmeans_workspace(const PqIndexShape& s, uint32_t n, void* base) {
  KmeansWorkspace w;
  w.x = static_cast<float*>(base);
  w.restarts = reinterpret_cast<uint32_t*>(w.x + size_t{s.n_kv_heads} * n * s.head_dim);
  w.assign = reinterpret_cast<uint8_t*>(w.restarts + size_t{s.n_kv_heads} * s.subspaces);
  return w;
}
}  // namespace

size_t kmeans_workspace_bytes(const PqIndexShape& s, uint32_t n) {
  const size_t codebooks = size_t{s.n_kv_heads} * s.subspaces;
  return size_t{s.n_kv_heads} * n * s.head_dim * 4 + codebooks * 4 + codebooks * n;
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
  if (n == 0 || s.head_dim / s.subspaces > kMaxSubDim || s.centroids > kMaxCentroids)
    return cudaErrorInvalidValue;
  // As the CPU's k-means: with no more points than centroids the seeds are final
  // (every point its own centroid).
  if (n <= s.centroids) return cudaSuccess;
  const uint32_t sub = s.head_dim / s.subspaces;
  const KmeansWorkspace w = kmeans_workspace(s, n, workspace);
  cudaError_t e = cudaMemsetAsync(w.restarts, 0, size_t{s.n_kv_heads} * s.subspaces * sizeof(uint32_t), st);
  if (e != cudaSuccess) return e;
  const size_t smem = size_t{s.centroids} * sub * sizeof(float);
  if ((e = ensure_dynamic_smem(reinterpret_cast<const void*>(assign_kernel), smem)) != cudaSuccess)
    return e;
  for (uint32_t it = 0; it < iterations; ++it) {
    assign_kernel<<<dim3((n + kThreads - 1) / kThreads, s.subspaces, s.n_kv_heads), kThreads, smem, st>>>(
        s, w.x, n, books, w.assign);
    update_kernel<<<dim3(s.subspaces, s.n_kv_heads), s.centroids, 0, st>>>(s, w.x, n, w.assign, books,
                                                                           w.restarts);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ssa::cuda
