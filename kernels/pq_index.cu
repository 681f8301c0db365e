// The PQ index on the GPU: encoding keys of device pages into code pages (nearest
// centroid per subspace; one block serves one (KV head, code row) pair of
// codebooks, kept in shared memory, and a tile of keys; keys multiplied by the
// head's transform first for OPQ and QPQ), and the sample of keys that k-means
// trains on (kernels/kmeans_seed.cu, kernels/kmeans_lloyd.cu).
#include <algorithm>
#include <type_traits>

#include "device_util.cuh"
#include "head_dim.cuh"
#include "kmeans_workspace.cuh"
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

// Nearest centroid of x among K in shared memory ([K][SUB], zero past the
// subspace's sub floats, as x); lowest index on ties.
template <int SUB>
__device__ uint32_t nearest(const float* cent, uint32_t K, const float (&x)[SUB]) {
  float best = INFINITY;
  uint32_t bc = 0;
  for (uint32_t c = 0; c < K; ++c) {
    const float* cc = cent + size_t{c} * SUB;
    float dist = 0.f;
#pragma unroll
    for (int j = 0; j < SUB; ++j) {
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

// The CPU's rotate() (lib/index/pq_index.cc) keeps eight interleaved partial
// sums of an element of T k and adds them pairwise in this order.
__device__ float sum_partials(const float (&a)[8]) {
  return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[4]), __fadd_rn(a[1], a[5])),
                   __fadd_rn(__fadd_rn(a[2], a[6]), __fadd_rn(a[3], a[7])));
}

// Element r of T k for a row of T and the key's elements key(j): the CPU's
// rotate() to the bit, products and sums rounded one by one.
template <typename Key>
__device__ float cpu_order_dot(const float* t_row, uint32_t d, Key key) {
  const uint32_t d8 = d / 8 * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (uint32_t j = 0; j < d8; j += 8) {
#pragma unroll
    for (uint32_t k = 0; k < 8; ++k) acc[k] = __fadd_rn(acc[k], __fmul_rn(t_row[j + k], key(j + k)));
  }
  float r = sum_partials(acc);
  for (uint32_t j = d8; j < d; ++j) r = __fadd_rn(r, __fmul_rn(t_row[j], key(j)));
  return r;
}

// Element r of T k, T's row in shared memory, the key read from its page.
template <typename T>
__device__ float transformed_elem(const PqIndexShape& s, const float* t_row, const uint8_t* const* kv_pages,
                                  uint32_t tok, uint32_t h) {
  return cpu_order_dot(t_row, s.head_dim, [&](uint32_t j) { return key_elem<T>(s, kv_pages, tok, h, j); });
}

// The PER x SUB elements of T k a thread's code needs (row p * sub + j of
// t_rows, zero past sub), each with cpu_order_dot's bits, in one pass over the
// key: eight partial sums per element, the key read once instead of once per
// element. For PER x SUB <= 16 (the registers of 8 partial sums each).
template <typename T, int SUB, int PER>
__device__ void transformed_sub_vectors(const PqIndexShape& s, const float* t_rows, const uint8_t* const* kv_pages,
                                        uint32_t tok, uint32_t h, uint32_t sub, float (&x)[PER][SUB]) {
  const uint32_t d = s.head_dim, d8 = d / 8 * 8;
  float acc[PER][SUB][8];
#pragma unroll
  for (int p = 0; p < PER; ++p)
#pragma unroll
    for (int j = 0; j < SUB; ++j)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[p][j][k] = 0.0f;
  for (uint32_t c = 0; c < d8; c += 8) {
    float kv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) kv[k] = key_elem<T>(s, kv_pages, tok, h, c + k);
#pragma unroll
    for (int p = 0; p < PER; ++p)
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
        if (j >= static_cast<int>(sub)) continue;
        const float* row = t_rows + (p * sub + j) * size_t{d} + c;
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[p][j][k] = __fadd_rn(acc[p][j][k], __fmul_rn(row[k], kv[k]));
      }
  }
#pragma unroll
  for (int p = 0; p < PER; ++p)
#pragma unroll
    for (int j = 0; j < SUB; ++j) {
      if (j >= static_cast<int>(sub)) {
        x[p][j] = 0.0f;
        continue;
      }
      float r = sum_partials(acc[p][j]);
      const float* row = t_rows + (p * sub + j) * size_t{d};
      for (uint32_t c = d8; c < d; ++c) r = __fadd_rn(r, __fmul_rn(row[c], key_elem<T>(s, kv_pages, tok, h, c)));
      x[p][j] = r;
    }
}

// One block: PER consecutive subspaces of one KV head (PER = 2 with 4-bit codes:
// the two nibbles of one code byte) and kThreads tokens. Shared memory: the
// subspaces' centroids [PER][K][SUB], then (a transformed proxy) the rows of T
// that make their sub-vectors [PER * sub][d]. With `y` (and s.key_transform
// false) the keys were transformed before: token begin + i's T k is
// y[h][i][d] of y_tokens per head (transform_keys_kernel).
template <typename T, int SUB, int PER>
__global__ void __launch_bounds__(kThreads) encode_kernel(PqIndexShape s, const uint8_t* const* kv_pages,
                                                          uint8_t* const* code_pages, const float* books,
                                                          uint32_t begin, uint32_t end, const uint32_t* begin_dev,
                                                          const float* y, uint32_t y_tokens) {
  // A decode step's token: its position is read here (kNoPosition: nothing to encode).
  if (begin_dev != nullptr) {
    begin = *begin_dev;
    if (begin == 0xFFFFFFFFu) return;
    end = begin + 1;
  }
  extern __shared__ float cent[];  // [PER][K][SUB], then [PER * sub][d]
  const uint32_t row = blockIdx.y, m0 = row * PER, h = blockIdx.z, sub = s.head_dim / s.subspaces;
  const uint32_t K = s.centroids, d = s.head_dim;
  for (uint32_t i = threadIdx.x; i < PER * K * SUB; i += kThreads) {
    const uint32_t p = i / (K * SUB), c = i / SUB % K, j = i % SUB;
    const float* src = books + (size_t{h} * s.subspaces + m0 + p) * K * sub;
    cent[i] = j < sub ? src[c * sub + j] : 0.0f;
  }
  float* t_rows = cent + PER * K * SUB;
  if (s.key_transform) {
    const float* t = books + device_books_layout(s).key_transform_offset() + (size_t{h} * d + m0 * sub) * d;
    for (uint32_t i = threadIdx.x; i < PER * sub * d; i += kThreads) t_rows[i] = t[i];
  }
  __syncthreads();
  const uint32_t tok = begin + blockIdx.x * kThreads + threadIdx.x;
  if (tok >= end) return;
  uint32_t code = 0;
  constexpr bool kOnePass = PER * SUB <= 16;
  float xs[PER][SUB];
  if constexpr (kOnePass) {
    if (s.key_transform) transformed_sub_vectors<T, SUB, PER>(s, t_rows, kv_pages, tok, h, sub, xs);
  }
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    float x[SUB];
#pragma unroll
    for (int j = 0; j < SUB; ++j) {
      if (j >= static_cast<int>(sub)) {
        x[j] = 0.0f;
      } else if (y != nullptr) {
        x[j] = y[(size_t{h} * y_tokens + (tok - begin)) * d + (m0 + p) * sub + j];
      } else if (s.key_transform) {
        x[j] = kOnePass ? xs[p][j] : transformed_elem<T>(s, t_rows + (p * sub + j) * size_t{d}, kv_pages, tok, h);
      } else {
        x[j] = key_elem<T>(s, kv_pages, tok, h, (m0 + p) * sub + j);
      }
    }
    code |= nearest<SUB>(cent + p * K * SUB, K, x) << (4 * p);
  }
  const uint32_t rows = s.code_bits == 4 ? s.subspaces / 2 : s.subspaces;
  code_pages[tok >> s.page_shift][(size_t{h} * rows + row) * s.page_tokens + (tok & (s.page_tokens - 1))] =
      static_cast<uint8_t>(code);
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

// The token of sample i of n, evenly spaced over the layer's n_tokens.
__device__ __forceinline__ uint32_t sample_token(uint32_t i, uint32_t n_tokens, uint32_t n) {
  return static_cast<uint32_t>((uint64_t{i} * n_tokens) / n);
}

// Copies the keys of `n` evenly spaced tokens into x[n_kv][n][head_dim] floats.
template <typename T>
__global__ void gather_kernel(PqIndexShape s, const uint8_t* const* kv_pages, uint32_t n_tokens, uint32_t n,
                              float* x) {
  const uint32_t i = blockIdx.x, h = blockIdx.y, d = s.head_dim, t = sample_token(i, n_tokens, n);
  float* out = x + (size_t{h} * n + i) * d;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = key_elem<T>(s, kv_pages, t, h, j);
}

// Which keys a transform reads: key i of `count` is token first + i (tokens to
// encode), or with `spaced` the i-th of count tokens evenly spaced over n_tokens
// (the k-means sample, as gather_kernel picks them).
struct KeyPick {
  uint32_t first, count, n_tokens;
  bool spaced;
  __device__ uint32_t token(uint32_t i) const { return spaced ? sample_token(i, n_tokens, count) : first + i; }
};

// T k of the picked keys into out[n_kv][count][head_dim], each element with
// cpu_order_dot's bits. One block: kGatherRows rows of the head's T and
// kGatherKeys keys, both staged in shared memory and read as float4s (T's rows
// padded by four floats: the lanes, consecutive rows, read different banks; a
// key's elements are read by a whole warp at once). Thread r % kGatherRows
// computes its row for kGatherKeys / 4 keys; a warp's stores are consecutive
// elements of one key.
constexpr uint32_t kGatherThreads = 256, kGatherRows = 64, kGatherKeys = 32;
constexpr uint32_t kGatherKeysPerThread = kGatherKeys / (kGatherThreads / kGatherRows);

size_t transform_keys_smem(uint32_t d) {
  return (size_t{kGatherRows} * (d + 4) + size_t{kGatherKeys} * d) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(kGatherThreads)
    transform_keys_kernel(PqIndexShape s, const uint8_t* const* kv_pages, KeyPick pick, const float* books,
                          float* out) {
  extern __shared__ float4 smem4[];  // T's rows [kGatherRows][d + 4], then the keys [kGatherKeys][d]
  float* t_s = reinterpret_cast<float*>(smem4);
  const uint32_t d = s.head_dim, ts = d + 4, h = blockIdx.z, r0 = blockIdx.y * kGatherRows;
  const uint32_t i0 = blockIdx.x * kGatherKeys, rows = min(kGatherRows, d - r0);
  float* k_s = t_s + kGatherRows * ts;
  const float* t = books + device_books_layout(s).key_transform_offset() + (size_t{h} * d + r0) * d;
  for (uint32_t e = threadIdx.x; e < rows * d; e += kGatherThreads) t_s[e / d * ts + e % d] = t[e];
  for (uint32_t e = threadIdx.x; e < kGatherKeys * d; e += kGatherThreads) {
    const uint32_t i = i0 + e / d;
    k_s[e] = i < pick.count ? key_elem<T>(s, kv_pages, pick.token(i), h, e % d) : 0.0f;
  }
  __syncthreads();
  const uint32_t r = threadIdx.x % kGatherRows, k0 = threadIdx.x / kGatherRows * kGatherKeysPerThread;
  if (r >= rows) return;
  const float* t_row = t_s + r * ts;
  float acc[kGatherKeysPerThread][8];
#pragma unroll
  for (uint32_t p = 0; p < kGatherKeysPerThread; ++p)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[p][k] = 0.0f;
  for (uint32_t j = 0; j < d; j += 8) {  // d is a multiple of 8 (pq_gather_sample, pq_encode_transformed)
    const float4 ta = *reinterpret_cast<const float4*>(t_row + j);
    const float4 tb = *reinterpret_cast<const float4*>(t_row + j + 4);
    const float tv[8] = {ta.x, ta.y, ta.z, ta.w, tb.x, tb.y, tb.z, tb.w};
#pragma unroll
    for (uint32_t p = 0; p < kGatherKeysPerThread; ++p) {
      const float4 ka = *reinterpret_cast<const float4*>(k_s + (k0 + p) * d + j);
      const float4 kb = *reinterpret_cast<const float4*>(k_s + (k0 + p) * d + j + 4);
      const float kv[8] = {ka.x, ka.y, ka.z, ka.w, kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[p][k] = __fadd_rn(acc[p][k], __fmul_rn(tv[k], kv[k]));
    }
  }
#pragma unroll
  for (uint32_t p = 0; p < kGatherKeysPerThread; ++p) {
    const uint32_t i = i0 + k0 + p;
    if (i < pick.count) out[(size_t{h} * pick.count + i) * d + r0 + r] = sum_partials(acc[p]);
  }
}

template <typename T>
cudaError_t launch_transform_keys(const PqIndexShape& s, const uint8_t* const* kv_pages, KeyPick pick,
                                  const float* books, float* out, cudaStream_t st) {
  const size_t smem = transform_keys_smem(s.head_dim);
  auto* kernel = transform_keys_kernel<T>;
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((pick.count + kGatherKeys - 1) / kGatherKeys, (s.head_dim + kGatherRows - 1) / kGatherRows,
                  s.n_kv_heads);
  kernel<<<grid, kGatherThreads, smem, st>>>(s, kv_pages, pick, books, out);
  return cudaGetLastError();
}

template <typename F>
cudaError_t with_dtype(DType t, F&& f) {
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_dtype(t, [&](auto v) { e = f(v); });
  return e;
}

cudaError_t launch_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                          const float* books, uint32_t begin, uint32_t end, const uint32_t* begin_dev,
                          cudaStream_t st, const float* y = nullptr, uint32_t y_tokens = 0) {
  const uint32_t sub = s.head_dim / s.subspaces;
  if (sub > 64 || (s.code_bits != 8 && s.code_bits != 4) || (s.code_bits == 4 && (s.centroids > 16 || s.subspaces % 2)))
    return cudaErrorInvalidValue;
  return with_dtype(s.dtype, [&](auto v) {
    using T = decltype(v);
    cudaError_t e = cudaErrorInvalidValue;
    dispatch_sub(sub, [&](auto sub_max) {
      constexpr int SUB = decltype(sub_max)::value;
      auto go = [&](auto per_c) {
        constexpr int PER = decltype(per_c)::value;
        const size_t smem = (size_t{s.centroids} * SUB * PER +
                             (s.key_transform ? size_t{PER} * sub * s.head_dim : 0)) * sizeof(float);
        auto* kernel = encode_kernel<T, SUB, PER>;
        if ((e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem)) != cudaSuccess) return;
        const dim3 grid((end - begin + kThreads - 1) / kThreads, s.subspaces / PER, s.n_kv_heads);
        kernel<<<grid, kThreads, smem, st>>>(s, kv_pages, code_pages, books, begin, end, begin_dev, y, y_tokens);
        e = cudaGetLastError();
      };
      if (s.code_bits == 4) go(std::integral_constant<int, 2>{}); else go(std::integral_constant<int, 1>{});
    });
    return e;
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

size_t pq_encode_scratch_bytes(const PqIndexShape& s, uint32_t tokens) {
  return size_t{s.n_kv_heads} * tokens * s.head_dim * sizeof(float);
}

cudaError_t pq_encode_transformed(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                                  const float* books, uint32_t begin, uint32_t end, float* scratch,
                                  uint32_t scratch_tokens, cudaStream_t st) {
  if (!s.key_transform || s.head_dim % 8 != 0 || scratch_tokens == 0) return cudaErrorInvalidValue;
  PqIndexShape plain = s;  // the chunk's keys are transformed already
  plain.key_transform = false;
  for (uint32_t b = begin; b < end; b += std::min(scratch_tokens, end - b)) {
    const uint32_t e = b + std::min(scratch_tokens, end - b);
    cudaError_t err = with_dtype(s.dtype, [&](auto v) {
      return launch_transform_keys<decltype(v)>(s, kv_pages, KeyPick{b, e - b, 0, false}, books, scratch, st);
    });
    if (err == cudaSuccess) err = launch_encode(plain, kv_pages, code_pages, books, b, e, nullptr, st, scratch, e - b);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

size_t kmeans_workspace_bytes(const PqIndexShape& s, uint32_t n) { return kmeans_workspace(s, n, nullptr).bytes; }

cudaError_t pq_gather_sample(const PqIndexShape& s, const uint8_t* const* kv_pages, uint32_t n_tokens,
                             uint32_t n, const float* books, void* workspace, cudaStream_t st) {
  if (n == 0 || s.head_dim / s.subspaces > 64 || s.key_transform != (books != nullptr) ||
      (books != nullptr && s.head_dim % 8 != 0))
    return cudaErrorInvalidValue;
  float* x = kmeans_workspace(s, n, workspace).x;
  return with_dtype(s.dtype, [&](auto v) {
    using T = decltype(v);
    if (books == nullptr) {
      gather_kernel<T><<<dim3(n, s.n_kv_heads), 128, 0, st>>>(s, kv_pages, n_tokens, n, x);
      return cudaGetLastError();
    }
    return launch_transform_keys<T>(s, kv_pages, KeyPick{0, n, n_tokens, true}, books, x, st);
  });
}

float* kmeans_sample_weights(const PqIndexShape& s, uint32_t n, void* workspace) {
  return kmeans_workspace(s, n, workspace).weights;
}

}  // namespace ssa::cuda
