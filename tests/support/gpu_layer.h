// Helpers of the GPU tests: device detection (tests pass with a "skipped" message
// when no CUDA device exists), device buffers, a paged KV store with PQ codes
// built straight in device memory, and float64 references computed on the host.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/inclusion_probability.h"
#include "kernels/cuda_decode.h"
#include "reference_attention.h"
#include "store/kv_layout.h"

namespace ssa::gputest {

inline bool has_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define SSA_GPU_TEST_OR_SKIP()                          \
  do {                                                  \
    if (!::ssa::gputest::has_device()) {                \
      MESSAGE("skipped: no CUDA device");               \
      return;                                           \
    }                                                   \
  } while (0)

#define CUDA_OK(expr)                                                   \
  do {                                                                  \
    cudaError_t e_ = (expr);                                            \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #expr, ": ", cudaGetErrorString(e_)); \
  } while (0)

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      cudaFree(p);
      p = o.p;
      n = o.n;
      o.p = nullptr;
    }
    return *this;
  }
  ~DevBuf() { cudaFree(p); }
  void upload(const std::vector<T>& v) {
    CUDA_OK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(size_t count) const {
    std::vector<T> v(count);
    CUDA_OK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Rounds x to the storage dtype and back (the values the kernels actually see).
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::kF16: return f16_to_f32(f32_to_f16(x));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(x));
    default: return x;
  }
}

inline std::vector<uint8_t> encode(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> raw(x.size() * dtype_bytes(t));
  for (size_t i = 0; i < x.size(); ++i) store_from_f32(raw.data(), t, i, x[i]);
  return raw;
}

// A layer of N tokens in device pages, plus host copies (rounded to the dtype)
// of everything for the references. Keys have structure: a few "needle" tokens
// align with the queries, the rest is noise, so attention is neither uniform nor
// a single spike.
struct TestLayer {
  KvLayout L;
  uint32_t n = 0;
  std::vector<float> k, v;  // [n][n_kv][d] rounded
  std::vector<float> q;     // [n_q][d] rounded
  std::vector<float> books; // [n_kv][M][K][sub]
  std::vector<uint8_t> codes; // [n][n_kv][M]
  std::vector<uint8_t*> kv_pages, code_pages;
  DevBuf<const uint8_t*> kv_table, code_table;
  DevBuf<float> books_dev;
  DevBuf<uint8_t> q_dev;

  TestLayer() = default;
  TestLayer(const TestLayer&) = delete;
  ~TestLayer() {
    for (auto* p : kv_pages) cudaFree(p);
    for (auto* p : code_pages) cudaFree(p);
  }
};

inline void build_layer(TestLayer& t, uint32_t n_q, uint32_t n_kv, uint32_t d, DType dt,
                        uint32_t n, uint32_t page_tokens, uint32_t M, uint32_t K, uint64_t seed,
                        float needle_gain = 3.0f, uint32_t code_period = 0, uint32_t code_bits = 8) {
  t.L.n_layers = 1;
  t.L.code_bits = code_bits;  // 4: two codes per byte (K <= 16), the CPU backend's layout
  t.L.n_q_heads = n_q;
  t.L.n_kv_heads = n_kv;
  t.L.head_dim = d;
  t.L.dtype = dt;
  t.L.pq_subspaces = M;
  t.L.pq_centroids = K;
  t.L.page_tokens = page_tokens;
  t.n = n;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  t.q.resize(size_t{n_q} * d);
  for (auto& x : t.q) x = round_to(dt, nd(rng));
  t.k.resize(size_t{n} * n_kv * d);
  t.v.resize(t.k.size());
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const uint32_t G = n_q / n_kv;
  for (uint32_t i = 0; i < n; ++i) {
    const bool needle = ud(rng) < 0.01f;
    for (uint32_t h = 0; h < n_kv; ++h) {
      const float* qh = t.q.data() + size_t{h * G} * d;
      for (uint32_t j = 0; j < d; ++j) {
        float x = nd(rng);
        if (needle) x += needle_gain * qh[j] / sqrtf(static_cast<float>(d)) * 4.0f;
        t.k[(size_t{i} * n_kv + h) * d + j] = round_to(dt, x);
        t.v[(size_t{i} * n_kv + h) * d + j] = round_to(dt, nd(rng));
      }
    }
  }
  // Codebooks: centroids are key sub-vectors of random tokens; codes: nearest.
  const uint32_t sub = d / M;
  t.books.resize(size_t{n_kv} * M * K * sub);
  std::uniform_int_distribution<uint32_t> pick(0, n - 1);
  for (uint32_t h = 0; h < n_kv; ++h)
    for (uint32_t m = 0; m < M; ++m)
      for (uint32_t c = 0; c < K; ++c) {
        const uint32_t src = pick(rng);
        for (uint32_t j = 0; j < sub; ++j)
          t.books[((size_t{h} * M + m) * K + c) * sub + j] = t.k[(size_t{src} * n_kv + h) * d + m * sub + j];
      }
  t.codes.resize(size_t{n} * n_kv * M);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t h = 0; h < n_kv; ++h)
      for (uint32_t m = 0; m < M; ++m) {
        const float* x = t.k.data() + (size_t{i} * n_kv + h) * d + m * sub;
        float best = INFINITY;
        uint32_t bc = 0;
        for (uint32_t c = 0; c < K; ++c) {
          const float* cc = t.books.data() + ((size_t{h} * M + m) * K + c) * sub;
          float dist = 0.f;
          for (uint32_t j = 0; j < sub; ++j) dist += (x[j] - cc[j]) * (x[j] - cc[j]);
          if (dist < best) {
            best = dist;
            bc = c;
          }
        }
        t.codes[(size_t{i} * n_kv + h) * M + m] = static_cast<uint8_t>(bc);
      }
  // code_period > 0: token i takes the codes of token i % code_period, so tokens
  // share PQ scores exactly (ties).
  for (uint32_t i = code_period; code_period > 0 && i < n; ++i)
    for (uint32_t x = 0; x < n_kv * M; ++x)
      t.codes[size_t{i} * n_kv * M + x] = t.codes[size_t{i % code_period} * n_kv * M + x];
  // Pages in device memory, in the KvLayout byte layout.
  const uint64_t pages = t.L.pages_for(n);
  const size_t eb = dtype_bytes(dt);
  for (uint64_t pg = 0; pg < pages; ++pg) {
    std::vector<uint8_t> kvp(t.L.kv_page_bytes(), 0), cp(t.L.code_page_bytes(), 0);
    for (uint32_t s = 0; s < page_tokens; ++s) {
      const uint64_t i = pg * page_tokens + s;
      if (i >= n) break;
      for (uint32_t h = 0; h < n_kv; ++h) {
        for (uint32_t j = 0; j < d; ++j) {
          store_from_f32(kvp.data() + t.L.k_offset(h, s), dt, j, t.k[(i * n_kv + h) * d + j]);
          store_from_f32(kvp.data() + t.L.v_offset(h, s), dt, j, t.v[(i * n_kv + h) * d + j]);
        }
        for (uint32_t m = 0; m < M; ++m) t.L.set_code(cp.data(), h, m, s, t.codes[(i * n_kv + h) * M + m]);
      }
    }
    uint8_t *a = nullptr, *b = nullptr;
    CUDA_OK(cudaMalloc(&a, kvp.size()));
    CUDA_OK(cudaMalloc(&b, cp.size()));
    CUDA_OK(cudaMemcpy(a, kvp.data(), kvp.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(b, cp.data(), cp.size(), cudaMemcpyHostToDevice));
    t.kv_pages.push_back(a);
    t.code_pages.push_back(b);
    (void)eb;
  }
  t.kv_table = DevBuf<const uint8_t*>(pages);
  t.code_table = DevBuf<const uint8_t*>(pages);
  std::vector<const uint8_t*> kt(t.kv_pages.begin(), t.kv_pages.end());
  std::vector<const uint8_t*> ct(t.code_pages.begin(), t.code_pages.end());
  t.kv_table.upload(kt);
  t.code_table.upload(ct);
  t.books_dev = DevBuf<float>(t.books.size());
  t.books_dev.upload(t.books);
  const std::vector<uint8_t> qraw = encode(dt, t.q);
  t.q_dev = DevBuf<uint8_t>(qraw.size());
  t.q_dev.upload(qraw);
}

inline cuda::DecodeShape shape_of(const KvLayout& L) {
  cuda::DecodeShape s;
  s.n_q_heads = L.n_q_heads;
  s.n_kv_heads = L.n_kv_heads;
  s.head_dim = L.head_dim;
  s.page_tokens = L.page_tokens;
  s.page_shift = 0;
  while ((1u << s.page_shift) < L.page_tokens) ++s.page_shift;
  s.pq_subspaces = L.pq_subspaces;
  s.pq_centroids = L.pq_centroids;
  s.pq_code_bits = L.code_bits;
  s.dtype = L.dtype;
  return s;
}

inline cuda::DecodeItem item_of(const TestLayer& t, void* out) {
  cuda::DecodeItem it;
  it.kv_pages = t.kv_table.p;
  it.code_pages = t.code_table.p;
  it.codebooks = t.books_dev.p;
  it.q = t.q_dev.p;
  it.out = out;
  it.n_tokens = t.n;
  return it;
}

// Scaled query of head h in double (as the kernels: q * (1/sqrt(d)) in float).
inline std::vector<double> scaled_q(const TestLayer& t, uint32_t h) {
  const uint32_t d = t.L.head_dim;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  std::vector<double> q(d);
  for (uint32_t j = 0; j < d; ++j) q[j] = static_cast<double>(t.q[size_t{h} * d + j] * scale);
  return q;
}

inline double exact_logit(const TestLayer& t, uint32_t h, uint32_t i, const std::vector<double>& q) {
  const uint32_t d = t.L.head_dim, kvh = h / t.L.group_size();
  const float* k = t.k.data() + (size_t{i} * t.L.n_kv_heads + kvh) * d;
  double s = 0;
  for (uint32_t j = 0; j < d; ++j) s += q[j] * k[j];
  return s;
}

inline double pq_logit(const TestLayer& t, uint32_t h, uint32_t i, const std::vector<double>& q) {
  const uint32_t d = t.L.head_dim, M = t.L.pq_subspaces, K = t.L.pq_centroids, sub = d / M;
  const uint32_t kvh = h / t.L.group_size();
  double s = 0;
  for (uint32_t m = 0; m < M; ++m) {
    const uint32_t c = t.codes[(size_t{i} * t.L.n_kv_heads + kvh) * M + m];
    const float* cc = t.books.data() + ((size_t{kvh} * M + m) * K + c) * sub;
    for (uint32_t j = 0; j < sub; ++j) s += q[m * sub + j] * cc[j];
  }
  return s;
}

// Weighted attention over (token, log pi) pairs in float64.
inline std::vector<double> attend_ref(const TestLayer& t, uint32_t h, const std::vector<uint32_t>& toks,
                                      const std::vector<double>& log_pi) {
  const uint32_t d = t.L.head_dim, kvh = h / t.L.group_size();
  const std::vector<double> q = scaled_q(t, h);
  std::vector<double> logit(toks.size());
  double mx = -INFINITY;
  for (size_t i = 0; i < toks.size(); ++i) {
    logit[i] = exact_logit(t, h, toks[i], q) - log_pi[i];
    mx = std::max(mx, logit[i]);
  }
  std::vector<double> o(d, 0.0);
  double l = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    const double w = exp(logit[i] - mx);
    l += w;
    const float* v = t.v.data() + (size_t{toks[i]} * t.L.n_kv_heads + kvh) * d;
    for (uint32_t j = 0; j < d; ++j) o[j] += w * v[j];
  }
  for (auto& x : o) x /= l;
  return o;
}

inline std::vector<float> decode_out(DType dt, const std::vector<uint8_t>& raw, size_t count) {
  std::vector<float> o(count);
  for (size_t i = 0; i < count; ++i) o[i] = load_as_f32(raw.data(), dt, i);
  return o;
}

// The relative L2 error of the head at `off` of a flat output against its reference.
inline double rel_err(const std::vector<float>& got, const std::vector<double>& ref, size_t off) {
  return ssa_test::rel_l2(got.data() + off, ref.data(), ref.size());
}

// Runs one launch set on the default stream with a fresh workspace.
struct Decoder {
  cuda::WorkspacePlan plan;
  DevBuf<uint8_t> blob;
  cuda::Workspace ws;
  uint32_t force_group_draws = 0;  // nonzero: the sampler's draws per group, instead of the plan's
  uint32_t force_cut_capacity = 0;  // nonzero: boundary-bin list entries per row, at most
  cudaError_t run(cuda::DecodeBatch* b, cudaStream_t st = nullptr) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaError_t e = cuda::plan_workspace(b, sms, &plan);
    if (e != cudaSuccess) return e;
    if (force_group_draws) plan.sample_group_draws = force_group_draws;
    if (force_cut_capacity) plan.cut_capacity = std::min(plan.cut_capacity, force_cut_capacity);
    if (blob.n < plan.total_bytes) blob = DevBuf<uint8_t>(plan.total_bytes);
    ws = cuda::bind_workspace(blob.p, plan);
    return cuda::run_decode(*b, plan, ws, st);
  }
};

}  // namespace ssa::gputest
