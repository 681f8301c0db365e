// GPU decode benchmark, the paper's configuration: 16 q heads, 4 KV heads, head
// dim 256, f16 KV, batch 1, contexts 128K and 1M, sparsity 50x. Times our dense
// decode, PQ_TOPK and SSA (h = 0.4) with CUDA events (warm-up, median of many
// runs), plus the median of each SSA stage launched alone in pipeline order.
// Prints a markdown table. Data: random keys/values in device pages, codebooks
// from random keys, codes by the GPU encoder.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_decode.h"
#include "kernels/pq_index.h"
#include "kernels/stages.h"

using namespace ssa;
using namespace ssa::cuda;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

__global__ void fill_normalish(__half* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 27; x *= 0x94D049BB133111EBull; x ^= x >> 33;
    // Sum of four uniforms: roughly normal, mean 0, variance 1/3 * 4 / 4.
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += static_cast<float>((x >> (16 * k)) & 0xffff) / 65535.f - 0.5f;
    p[i] = __float2half(s * 1.7320508f);
  }
}

__global__ void fill_books(const __half* k, float* books, uint32_t n_tok_stride, int kv, int M, int K, int sub,
                           int d) {
  // Centroid c of (h, m) = sub-vector m of the key of token 997 * c (head h).
  const int c = blockIdx.x, m = blockIdx.y, h = blockIdx.z;
  for (int j = threadIdx.x; j < sub; j += blockDim.x) {
    const size_t t = (size_t{997} * c) % n_tok_stride;
    books[((size_t(h) * M + m) * K + c) * sub + j] = __half2float(k[(size_t(h) * n_tok_stride + t) * d + m * sub + j]);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

float time_ms(const std::function<void()>& f, int warm = 5, int reps = 30) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

int main() {
  // SSA_BENCH_PROFILE=1: one decode of each 1M configuration, no timing loops
  // (for a profiler that records every kernel).
  const bool profile = getenv("SSA_BENCH_PROFILE") != nullptr;
  const uint32_t nq = 16, nkv = 4, d = 256, M = 16, K = 256, P = 256;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("| context | method | budget k | total ms | stages (ms) | KV+code bytes read | effective GB/s |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (uint32_t n : {131072u, 1048576u}) {
    if (profile && n != 1048576u) continue;
    const uint32_t pages = n / P;
    const size_t kv_page = size_t{2} * P * nkv * d * 2, code_page = size_t{nkv} * M * P;
    uint8_t *kv = nullptr, *codes = nullptr;
    CK(cudaMalloc(&kv, kv_page * pages));
    CK(cudaMalloc(&codes, code_page * pages));
    fill_normalish<<<4096, 256>>>(reinterpret_cast<__half*>(kv), kv_page * pages / 2, n);
    std::vector<const uint8_t*> kt(pages), ct(pages);
    for (uint32_t i = 0; i < pages; ++i) kt[i] = kv + kv_page * i, ct[i] = codes + code_page * i;
    const uint8_t** kt_d;
    const uint8_t** ct_d;
    CK(cudaMalloc(&kt_d, pages * 8));
    CK(cudaMalloc(&ct_d, pages * 8));
    CK(cudaMemcpy(kt_d, kt.data(), pages * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ct_d, ct.data(), pages * 8, cudaMemcpyHostToDevice));
    float* books;
    CK(cudaMalloc(&books, size_t{nkv} * M * K * (d / M) * 4));
    // Keys of the first page, as [h][P][d]: centroids from them.
    fill_books<<<dim3(K, M, nkv), 32>>>(reinterpret_cast<const __half*>(kv), books, P, nkv, M, K, d / M, d);
    PqIndexShape is{nkv, d, M, K, P, 8, DType::kF16};
    CK(pq_encode(is, kt_d, (uint8_t* const*)(ct_d), books, 0, n, nullptr));
    __half *q, *out;
    CK(cudaMalloc(&q, nq * d * 2));
    CK(cudaMalloc(&out, nq * d * 2));
    fill_normalish<<<16, 256>>>(q, nq * d, 7);
    CK(cudaDeviceSynchronize());

    struct Cfg { const char* name; Proxy proxy; Sampling sampling; float h; };
    const Cfg cfgs[] = {{"dense (ours)", Proxy::kNone, Sampling::kNone, 0.f},
                        {"PQ_TOPK", Proxy::kPq, Sampling::kNone, 1.f},
                        {"SSA h=0.4", Proxy::kPq, Sampling::kProxy, 0.4f}};
    const uint32_t k = (n + 49) / 50;
    for (const Cfg& c : cfgs) {
      DecodeBatch b{};
      b.shape = DecodeShape{nq, nkv, d, P, 8, M, K, DType::kF16};
      b.n_items = 1;
      b.proxy = c.proxy;
      b.sampling = c.sampling;
      b.seed = 1;
      DecodeItem& it = b.items[0];
      it.kv_pages = kt_d;
      it.code_pages = ct_d;
      it.codebooks = books;
      it.q = q;
      it.out = out;
      it.n_tokens = n;
      const bool dense = c.proxy == Proxy::kNone;
      it.sink_end = dense ? n : 128;
      it.local_begin = dense ? n : n - 128;
      it.n_select = dense ? 0 : k - 256;
      it.n_heavy = dense ? 0 : static_cast<uint32_t>(c.h * it.n_select + 0.5f);
      WorkspacePlan plan;
      CK(plan_workspace(&b, sms, &plan));
      void* blob;
      CK(cudaMalloc(&blob, plan.total_bytes));
      const Workspace ws = bind_workspace(blob, plan);
      uint64_t step = 0;
      if (profile) {
        CK(run_decode(b, plan, ws, nullptr));
        CK(cudaDeviceSynchronize());
        CK(cudaFree(blob));
        continue;
      }
      const float total = time_ms([&] {
        b.step = step++;
        CK(run_decode(b, plan, ws, nullptr));
      });
      std::string stages;
      if (!dense) {
        const float t_score = time_ms([&] {
          CK(launch_init_rows(b, plan, ws, nullptr));
          CK(launch_pq_scores(b, plan, ws, nullptr));
        });
        const float t_topk = time_ms([&] { CK(launch_radix_topk(b, plan, ws, nullptr)); });
        float t_sample = 0.f;
        if (c.sampling != Sampling::kNone) {
          // Sampling masks heavy scores: re-score before each timed sampling run
          // and subtract the scoring time.
          const float both = time_ms([&] {
            CK(launch_init_rows(b, plan, ws, nullptr));
            CK(launch_pq_scores(b, plan, ws, nullptr));
            CK(launch_radix_topk(b, plan, ws, nullptr));
            CK(launch_sampling(b, plan, ws, nullptr));
          });
          t_sample = both - t_score - t_topk;
        }
        const float t_attn = time_ms([&] { CK(launch_attention(b, plan, ws, false, nullptr)); });
        char buf[200];
        snprintf(buf, sizeof buf, "score %.3f, top-k %.3f, sample %.3f, attention %.3f (%u splits)", t_score,
                 t_topk, t_sample, t_attn, plan.n_splits);
        stages = buf;
      } else {
        char buf[64];
        snprintf(buf, sizeof buf, "%u splits", plan.n_splits);
        stages = buf;
      }
      // Bytes: dense reads all K/V once; sparse reads codes once per KV head plus
      // k rows of K and V per q head (upper bound: k distinct rows).
      const double bytes = dense ? double(n) * nkv * d * 2 * 2
                                 : double(n) * nkv * M + double(k) * nq * d * 2 * 2;
      printf("| %uK | %s | %s | %.3f | %s | %.1f MB | %.0f |\n", n / 1024, c.name, dense ? "N" : std::to_string(k).c_str(),
             total, stages.c_str(), bytes / 1e6, bytes / (total * 1e-3) / 1e9);
      fflush(stdout);
      CK(cudaFree(blob));
    }
    cudaFree(kv);
    cudaFree(codes);
    cudaFree(kt_d);
    cudaFree(ct_d);
    cudaFree(books);
    cudaFree(q);
    cudaFree(out);
  }
  return 0;
}
