// The query-aware proxies' training steps per key on the GPU, each with the
// CPU's order of operations (lib/index/query_transform.cc, rotation.cc,
// key_weights.cc) and every product and sum rounded one by one, so that the
// bits are the host's:
//  - whiten: a thread per (key, output row), its double sum over j in order;
//  - second moments: a thread per upper-triangle entry, its double sum over the
//    keys in order (products of floats are exact in a double);
//  - key weights: a thread per query scores a block's keys in dimension order; a block
//    per (query, head) finds the query's threshold by radix selection over the
//    scores' order-preserving integer images (exact: the value the host's
//    nth_element returns, or an equal one); a thread per key counts the
//    thresholds it reaches.
#include <stdint.h>

#include "head_dim.cuh"
#include "index/key_weights.h"
#include "query_aware_train.h"

namespace ssa::cuda {
namespace {

constexpr uint32_t kThreads = 256;

__global__ void whiten_kernel(PqIndexShape s, uint32_t n, const double* a_t, const float* x, float* y) {
  const uint32_t d = s.head_dim, h = blockIdx.y;
  const uint64_t e = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // key i, row r
  if (e >= uint64_t{n} * d) return;
  const uint32_t i = static_cast<uint32_t>(e / d), r = static_cast<uint32_t>(e % d);
  const float* xi = x + (size_t{h} * n + i) * d;
  const double* at = a_t + size_t{h} * d * d;
  double acc = 0.0;
  for (uint32_t j = 0; j < d; ++j) acc = __dadd_rn(acc, __dmul_rn(at[size_t{j} * d + r], static_cast<double>(xi[j])));
  y[(size_t{h} * n + i) * d + r] = static_cast<float>(acc);
}

__global__ void second_moments_kernel(PqIndexShape s, uint32_t n, const float* y, double* c) {
  const uint32_t d = s.head_dim, h = blockIdx.y;
  const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= d * d) return;
  const uint32_t i = e / d, j = e % d;
  if (j < i) return;
  const float* yh = y + size_t{h} * n * d;
  double acc = 0.0;
  for (uint32_t t = 0; t < n; ++t)
    acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(yh[size_t{t} * d + i]),
                                   static_cast<double>(yh[size_t{t} * d + j])));
  c[(size_t{h} * d + i) * d + j] = acc;
}

// scores[h][j][i] (a query's scores contiguous): key i by query j, summed over
// the dimensions in order as the host's key_query_scores does. A block takes
// kScoreKeys keys of one head into shared memory and a thread per query scores
// them all, reading the queries transposed (qt: [n_kv][d][m_max]) so that a
// warp's loads are contiguous.
constexpr uint32_t kScoreKeys = 32;
__global__ void __launch_bounds__(kThreads) scores_kernel(PqIndexShape s, uint32_t n, const float* x, const float* qt,
                                                          uint32_t m_max, const uint32_t* counts, float* scores) {
  extern __shared__ float keys_s[];  // [kScoreKeys][d]
  const uint32_t d = s.head_dim, h = blockIdx.y, i0 = blockIdx.x * kScoreKeys;
  const uint32_t keys = min(kScoreKeys, n - i0);
  for (uint32_t e = threadIdx.x; e < keys * d; e += blockDim.x) keys_s[e] = x[(size_t{h} * n + i0) * d + e];
  __syncthreads();
  const uint32_t m = counts[h];
  const float* qh = qt + size_t{h} * d * m_max;
  for (uint32_t j = threadIdx.x; j < m; j += blockDim.x) {
    for (uint32_t k = 0; k < keys; ++k) {
      const float* xk = keys_s + size_t{k} * d;
      float acc = 0.0f;
      for (uint32_t e = 0; e < d; ++e) acc = __fadd_rn(acc, __fmul_rn(xk[e], qh[size_t{e} * m_max + j]));
      scores[(size_t{h} * m_max + j) * n + i0 + k] = acc;
    }
  }
}

// The queries [n_kv][m_max][d] as [n_kv][d][m_max].
__global__ void transpose_queries_kernel(uint32_t d, uint32_t m_max, const float* q, float* qt) {
  const uint32_t h = blockIdx.y;
  const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= d * m_max) return;
  const uint32_t j = e / d, k = e % d;
  qt[(size_t{h} * d + k) * m_max + j] = q[(size_t{h} * m_max + j) * d + k];
}

// Ascending floats as ascending unsigned integers.
__device__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ float order_value(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}

// The top-th highest of a query's n scores, 8 bits at a time from the top: each
// pass counts the keys that share the prefix found so far by their next digit,
// then walks the digits from the highest until `top` is reached.
__global__ void __launch_bounds__(kThreads) threshold_kernel(uint32_t n, uint32_t m_max, const uint32_t* counts,
                                                              uint32_t top, const float* scores, float* thresholds) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t prefix_s, rank_s;
  const uint32_t j = blockIdx.x, h = blockIdx.y;
  if (j >= counts[h]) return;
  const float* col = scores + (size_t{h} * m_max + j) * n;
  if (threadIdx.x == 0) {
    prefix_s = 0;
    rank_s = top;  // the rank (1 = highest) still sought among the keys that share the prefix
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = prefix_s;
    const uint32_t high_mask = shift == 24 ? 0u : ~0u << (shift + 8);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t u = order_key(col[i]);
      if ((u & high_mask) == (prefix & high_mask)) atomicAdd(&hist[(u >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t rank = rank_s, digit = 255;
      for (;; --digit) {
        if (hist[digit] >= rank || digit == 0) break;
        rank -= hist[digit];
      }
      prefix_s = prefix | (digit << shift);
      rank_s = rank;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) thresholds[size_t{h} * m_max + j] = order_value(prefix_s);
}

__global__ void weights_kernel(uint32_t n, uint32_t m_max, const uint32_t* counts, const float* scores,
                               const float* thresholds, float* w) {
  const uint32_t h = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t m = counts[h];
  if (m == 0) {
    w[size_t{h} * n + i] = 1.0f;
    return;
  }
  uint32_t hits = 0;
  for (uint32_t j = 0; j < m; ++j)
    hits += scores[(size_t{h} * m_max + j) * n + i] >= thresholds[size_t{h} * m_max + j] ? 1u : 0u;
  w[size_t{h} * n + i] =
      __fadd_rn(1.0f, __fdiv_rn(__fmul_rn(kHeavyKeyBoost, static_cast<float>(hits)), static_cast<float>(m)));
}

uint32_t blocks_for(uint64_t count) { return static_cast<uint32_t>((count + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t qa_whiten_keys(const PqIndexShape& s, uint32_t n, const double* a_t, const float* x, float* y,
                           cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  whiten_kernel<<<dim3(blocks_for(uint64_t{n} * s.head_dim), s.n_kv_heads), kThreads, 0, st>>>(s, n, a_t, x, y);
  return cudaGetLastError();
}

cudaError_t qa_second_moments(const PqIndexShape& s, uint32_t n, const float* y, double* c, cudaStream_t st) {
  second_moments_kernel<<<dim3(blocks_for(uint64_t{s.head_dim} * s.head_dim), s.n_kv_heads), kThreads, 0, st>>>(
      s, n, y, c);
  return cudaGetLastError();
}

size_t qa_key_weights_scratch_bytes(const PqIndexShape& s, uint32_t n, uint32_t m) {
  // The scores, the thresholds, the transposed queries.
  return size_t{s.n_kv_heads} * m * (size_t{n} + 1 + s.head_dim) * sizeof(float);
}

cudaError_t qa_key_weights(const PqIndexShape& s, uint32_t n, const float* x, const float* q, uint32_t m_max,
                           const uint32_t* counts, void* scratch, float* w, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  if (m_max == 0) return cudaErrorInvalidValue;
  float* scores = static_cast<float*>(scratch);
  float* thresholds = scores + size_t{s.n_kv_heads} * m_max * n;
  float* qt = thresholds + size_t{s.n_kv_heads} * m_max;
  // The host's rank, and the ceiling of n x the fraction the same way.
  const auto top = static_cast<uint32_t>(heavy_key_count(n));
  transpose_queries_kernel<<<dim3(blocks_for(uint64_t{s.head_dim} * m_max), s.n_kv_heads), kThreads, 0, st>>>(
      s.head_dim, m_max, q, qt);
  const size_t smem = size_t{kScoreKeys} * s.head_dim * sizeof(float);
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(scores_kernel), smem);
  if (e != cudaSuccess) return e;
  scores_kernel<<<dim3((n + kScoreKeys - 1) / kScoreKeys, s.n_kv_heads), kThreads, smem, st>>>(s, n, x, qt, m_max,
                                                                                              counts, scores);
  threshold_kernel<<<dim3(m_max, s.n_kv_heads), kThreads, 0, st>>>(n, m_max, counts, top, scores, thresholds);
  weights_kernel<<<dim3(blocks_for(n), s.n_kv_heads), kThreads, 0, st>>>(n, m_max, counts, scores, thresholds, w);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
