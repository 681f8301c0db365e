// Lloyd iterations of the PQ codebooks on the GPU, deterministic and without a
// pass per centroid. Each iteration is two kernels:
//  - assign_accumulate: blocks of (a run of sample points, subspace, KV head) find
//    each point's nearest centroid (the codebook in shared memory, the point in
//    registers) and add the point into its centroid's sums in shared memory, then
//    into the codebook's sums in global memory. The sums are 64-bit fixed-point
//    integers (a power-of-two scale per codebook, from its largest coordinate, so
//    that no sum overflows): integer addition is associative, so the atomics give
//    the same sums in every run, whatever the order.
//  - finish: one block per codebook, a thread per centroid: the mean of its
//    points; an empty cluster restarts at a random sample point, the one the CPU's
//    k-means picks (restarts drawn in centroid order from the codebook's stream,
//    continuing across iterations); the sums cleared for the next iteration.
// Weighted training (the query-aware proxies' key weights) sums w x and w, each
// in fixed point (w x is exact in a double), and a centroid is its points'
// weighted mean, as the CPU's weighted k-means takes it.
#include <algorithm>
#include <type_traits>

#include "device_util.cuh"
#include "head_dim.cuh"
#include "index/kmeans_rng.h"
#include "kmeans_workspace.cuh"
#include "pq_index.h"

namespace ssa::cuda {
namespace {

constexpr uint32_t kThreads = 256;
constexpr uint32_t kPointsPerThread = 8;
constexpr uint32_t kBlockPoints = kThreads * kPointsPerThread;
constexpr uint32_t kMaxSub = 64;
constexpr uint32_t kMaxCentroids = 256;

// Each codebook's largest |coordinate| (times its point's weight, when weighted)
// over the sample, and each head's largest weight, as float bits (the order of
// non-negative floats is their bits' order): a block per (run of points, KV
// head), a thread per coordinate, one atomic per (block, subspace). The products
// |x| w are rounded up, so the shift below holds for the exact ones.
constexpr uint32_t kMaxAbsBlocks = 128;
__global__ void max_abs_kernel(PqIndexShape s, const float* x, const float* weights, uint32_t n, uint32_t* max_abs,
                               uint32_t* max_weight) {
  extern __shared__ float col_max[];  // [head_dim]
  const uint32_t h = blockIdx.y, sub = s.head_dim / s.subspaces, j = threadIdx.x;
  const uint32_t per = (n + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per, i1 = min(n, i0 + per);
  float mx = 0.0f, wmax = 0.0f;
  for (uint32_t i = i0; i < i1; ++i) {
    const float a = fabsf(x[(size_t{h} * n + i) * s.head_dim + j]);
    const float w = weights != nullptr ? weights[size_t{h} * n + i] : 1.0f;
    mx = fmaxf(mx, weights != nullptr ? __fmul_ru(a, w) : a);
    wmax = fmaxf(wmax, w);
  }
  col_max[j] = mx;
  __syncthreads();
  if (j < s.subspaces) {
    float book_max = 0.0f;
    for (uint32_t k = 0; k < sub; ++k) book_max = fmaxf(book_max, col_max[j * sub + k]);
    atomicMax(max_abs + h * s.subspaces + j, __float_as_uint(book_max));
  }
  if (j == 0 && weights != nullptr) atomicMax(max_weight + h, __float_as_uint(wmax));
}

// The fixed-point exponent of a codebook: |coordinate| < 2^e, and n points sum
// below 2^62 in magnitude (also that of the weight sums, from the largest weight).
__device__ int fixed_point_shift(uint32_t max_abs_bits, uint32_t n) {
  int e = 0;
  frexp(static_cast<double>(__uint_as_float(max_abs_bits)), &e);  // 0 for 0
  int log2n = 0;
  while ((uint64_t{1} << log2n) < n) ++log2n;
  return 62 - e - log2n;
}

template <int SUB>
__global__ void __launch_bounds__(kThreads) assign_accumulate_kernel(PqIndexShape s, const float* x, uint32_t n,
                                                                     const float* books, KmeansWorkspace w,
                                                                     bool weighted) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t m = blockIdx.y, h = blockIdx.z, K = s.centroids, sub = s.head_dim / s.subspaces;
  const uint32_t hm = h * s.subspaces + m;
  // cent[K][SUB] (zero past sub), norm[K], sums[K][sub], mass[K], counts[K]
  float* cent = reinterpret_cast<float*>(smem);
  float* norm = cent + K * SUB;
  unsigned long long* sums = reinterpret_cast<unsigned long long*>(norm + K + (K & 1));
  unsigned long long* mass = sums + K * sub;
  uint32_t* counts = reinterpret_cast<uint32_t*>(mass + K);
  const float* book = books + size_t{hm} * K * sub;
  for (uint32_t e = threadIdx.x; e < K * SUB; e += kThreads) {
    const uint32_t c = e / SUB, j = e % SUB;
    cent[e] = j < sub ? book[c * sub + j] : 0.0f;
  }
  for (uint32_t e = threadIdx.x; e < K * sub; e += kThreads) sums[e] = 0;
  for (uint32_t c = threadIdx.x; c < K; c += kThreads) {
    counts[c] = 0;
    mass[c] = 0;
  }
  __syncthreads();
  for (uint32_t c = threadIdx.x; c < K; c += kThreads) {
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < SUB; ++j) q = fmaf(cent[c * SUB + j], cent[c * SUB + j], q);
    norm[c] = q;
  }
  const double scale = ldexp(1.0, fixed_point_shift(w.max_abs[hm], n));
  const double mass_scale = weighted ? ldexp(1.0, fixed_point_shift(w.max_weight[h], n)) : 0.0;
  __syncthreads();

  // P points per thread at a time share each centroid's shared-memory loads.
  constexpr int P = SUB <= 16 ? 2 : 1;
  const uint32_t i0 = blockIdx.x * kBlockPoints;
  for (uint32_t r = 0; r < kPointsPerThread; r += P) {
    float xv[P][SUB], wv[P];
    bool valid[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const uint32_t i = i0 + (r + k) * kThreads + threadIdx.x;
      valid[k] = i < n;
      wv[k] = weighted && valid[k] ? w.weights[size_t{h} * n + i] : 1.0f;
      const float* p = x + (size_t{h} * n + (valid[k] ? i : 0)) * s.head_dim + m * sub;
#pragma unroll
      for (int j = 0; j < SUB; ++j) xv[k][j] = j < sub ? p[j] : 0.0f;
    }
    if (!valid[0]) break;
    // argmin over c of |c|^2 - 2 x.c (|x - c|^2 less |x|^2); lowest index on ties.
    float best[P];
    uint32_t bc[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      best[k] = INFINITY;
      bc[k] = 0;
    }
#pragma unroll 2
    for (uint32_t c = 0; c < K; ++c) {
      const float* cc = cent + c * SUB;
      float dot[P];
#pragma unroll
      for (int k = 0; k < P; ++k) dot[k] = 0.0f;
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
        const float cj = cc[j];
#pragma unroll
        for (int k = 0; k < P; ++k) dot[k] = fmaf(xv[k][j], cj, dot[k]);
      }
      const float nc = norm[c];
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const float d = fmaf(-2.0f, dot[k], nc);
        if (d < best[k]) {
          best[k] = d;
          bc[k] = c;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (!valid[k]) continue;
      // x w is exact in a double (two 24-bit significands), as is its product
      // with the power of two.
      const double wk = weighted ? static_cast<double>(wv[k]) : 1.0;
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
        if (j < sub) {
          const long long q = __double2ll_rn(static_cast<double>(xv[k][j]) * wk * scale);
          atomicAdd(sums + bc[k] * sub + j, static_cast<unsigned long long>(q));
        }
      }
      if (weighted) atomicAdd(mass + bc[k], static_cast<unsigned long long>(__double2ll_rn(wk * mass_scale)));
      atomicAdd(counts + bc[k], 1u);
    }
  }
  __syncthreads();
  unsigned long long* gsums = reinterpret_cast<unsigned long long*>(w.sums) + size_t{hm} * K * sub;
  for (uint32_t e = threadIdx.x; e < K * sub; e += kThreads)
    if (sums[e] != 0) atomicAdd(gsums + e, sums[e]);
  for (uint32_t c = threadIdx.x; c < K; c += kThreads) {
    if (counts[c] != 0) atomicAdd(w.counts + size_t{hm} * K + c, counts[c]);
    if (mass[c] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(w.mass) + size_t{hm} * K + c, mass[c]);
  }
}

__global__ void finish_kernel(PqIndexShape s, const float* x, uint32_t n, float* books, KmeansWorkspace w,
                              bool weighted) {
  __shared__ uint8_t empty_s[kMaxCentroids];
  const uint32_t m = blockIdx.x, h = blockIdx.y, c = threadIdx.x, sub = s.head_dim / s.subspaces;
  const uint32_t hm = h * s.subspaces + m, K = s.centroids;
  uint32_t* count_p = w.counts + size_t{hm} * K + c;
  long long* sum = w.sums + (size_t{hm} * K + c) * sub;
  const uint32_t count = *count_p;
  *count_p = 0;
  float* cen = books + (size_t{hm} * K + c) * sub;
  empty_s[c] = count == 0;
  const uint32_t drawn = w.restarts[hm];
  __syncthreads();
  if (count == 0) {
    uint32_t rank = 0;  // empty clusters before this one
    for (uint32_t e = 0; e < c; ++e) rank += empty_s[e];
    const uint64_t pick = kmeans_restart_point(kmeans_stream(codebook_seed(h, m, s.subspaces)), drawn + rank, n);
    const float* p = x + (size_t{h} * n + pick) * s.head_dim + m * sub;
    for (uint32_t j = 0; j < sub; ++j) cen[j] = p[j];
  } else {
    // sum / 2^shift is exact in a double (a power of two); one rounding in the
    // division, one to float. Weighted: the sum times the inverse of the
    // cluster's weight, as the CPU takes it.
    const double unscale = ldexp(1.0, -fixed_point_shift(w.max_abs[hm], n));
    double inv = 0.0;
    if (weighted) {
      long long* mass = w.mass + size_t{hm} * K + c;
      inv = 1.0 / (static_cast<double>(*mass) * ldexp(1.0, -fixed_point_shift(w.max_weight[h], n)));
      *mass = 0;
    }
    for (uint32_t j = 0; j < sub; ++j) {
      cen[j] = weighted ? static_cast<float>(static_cast<double>(sum[j]) * unscale * inv)
                        : static_cast<float>(static_cast<double>(sum[j]) * unscale / count);
      sum[j] = 0;
    }
  }
  if (c == 0) {
    uint32_t total = 0;
    for (uint32_t e = 0; e < blockDim.x; ++e) total += empty_s[e];
    w.restarts[hm] = drawn + total;
  }
}

template <typename F>
bool dispatch_sub(uint32_t sub, F&& f) {
  if (sub <= 4) return f(std::integral_constant<int, 4>{}), true;
  if (sub <= 8) return f(std::integral_constant<int, 8>{}), true;
  if (sub <= 16) return f(std::integral_constant<int, 16>{}), true;
  if (sub <= 32) return f(std::integral_constant<int, 32>{}), true;
  if (sub <= 64) return f(std::integral_constant<int, 64>{}), true;
  return false;
}

}  // namespace

cudaError_t pq_lloyd(const PqIndexShape& s, uint32_t n, uint32_t iterations, bool weighted, void* workspace,
                     float* books, cudaStream_t st) {
  const uint32_t sub = s.head_dim / s.subspaces;
  if (n == 0 || sub > kMaxSub || s.centroids == 0 || s.centroids > kMaxCentroids) return cudaErrorInvalidValue;
  // As the CPU's k-means: with no more points than centroids the seeds are final
  // (every point its own centroid).
  if (n <= s.centroids || iterations == 0) return cudaSuccess;
  const KmeansWorkspace w = kmeans_workspace(s, n, workspace);
  const size_t codebooks = size_t{s.n_kv_heads} * s.subspaces, K = s.centroids;
  cudaError_t e;
  if ((e = cudaMemsetAsync(w.sums, 0, codebooks * K * sub * sizeof(long long), st)) != cudaSuccess ||
      (e = cudaMemsetAsync(w.counts, 0, codebooks * K * sizeof(uint32_t), st)) != cudaSuccess ||
      (e = cudaMemsetAsync(w.restarts, 0, codebooks * sizeof(uint32_t), st)) != cudaSuccess ||
      (e = cudaMemsetAsync(w.max_abs, 0, codebooks * sizeof(uint32_t), st)) != cudaSuccess ||
      (e = cudaMemsetAsync(w.mass, 0, codebooks * K * sizeof(long long), st)) != cudaSuccess ||
      (e = cudaMemsetAsync(w.max_weight, 0, s.n_kv_heads * sizeof(uint32_t), st)) != cudaSuccess)
    return e;
  max_abs_kernel<<<dim3(std::min(n, kMaxAbsBlocks), s.n_kv_heads), s.head_dim, s.head_dim * sizeof(float), st>>>(
      s, w.x, weighted ? w.weights : nullptr, n, w.max_abs, w.max_weight);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const dim3 grid((n + kBlockPoints - 1) / kBlockPoints, s.subspaces, s.n_kv_heads);
  dispatch_sub(sub, [&](auto sub_max) {
    constexpr int SUB = decltype(sub_max)::value;
    const auto kernel = assign_accumulate_kernel<SUB>;
    const size_t smem = K * SUB * sizeof(float) + (K + (K & 1)) * sizeof(float) +
                        (K * sub + K) * sizeof(long long) + K * sizeof(uint32_t);
    if ((e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem)) != cudaSuccess) return;
    for (uint32_t it = 0; it < iterations; ++it) {
      kernel<<<grid, kThreads, smem, st>>>(s, w.x, n, books, w, weighted);
      finish_kernel<<<dim3(s.subspaces, s.n_kv_heads), s.centroids, 0, st>>>(s, w.x, n, books, w, weighted);
    }
    e = cudaGetLastError();
  });
  return e;
}

}  // namespace ssa::cuda
