// Sharded CUDA decode against the unsharded one (docs/SHARDING.md): the same
// rows appended to a session of an unsharded runtime and of runtimes of 2 and 4
// shards, one shard per GPU of the machine round robin (several shards share a
// GPU where it has fewer: then this measures what the sharded path costs — its
// host round trips for the global top-k, the partials' copies and merge — not a
// speed-up). Per shape, context and shard count: DENSE, PQ_TOPK and SSA at 50x
// sparsity, batch 1 (ssa_decode) and batch B (ssa_decode_batch over forks of the
// session, which share its pages), median wall time of --reps decodes with the
// device idle before each; the sharded output's relative L2 difference from the
// unsharded one (the heavy sets and samples are equal, the splits' rounding is
// not).
//
//   gpu_sharded_bench [--contexts 1048576,2097152] [--shards 2,4] [--batch 16] [--reps 10] [--configs paper,llama]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.h"
#include "common/dtype.h"
#include "shard/shard_options.h"
#include "cuda_check.cuh"

namespace {

__device__ float hash_normal(uint64_t i) {
  // Sum of four uniform hashes: mean 0, variance 1 (near enough for timing).
  float s = 0.f;
  for (int r = 0; r < 4; ++r) {
    uint64_t x = (i * 4 + r) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    s += static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f;
  }
  return s * 1.7320508f;
}

template <typename T>
__global__ void fill_kernel(T* out, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float v = hash_normal(seed * 0x100000000ull + i);
    if constexpr (std::is_same_v<T, __half>) {
      out[i] = __float2half(v);
    } else {
      out[i] = __float2bfloat16(v);
    }
  }
}

void fill_device(void* p, size_t n, ssa_dtype dt, uint64_t seed) {
  if (dt == SSA_DTYPE_F16) {
    fill_kernel<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  } else {
    fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  }
  CUDA_OK(cudaGetLastError());
}

ssa_runtime* make_runtime(uint32_t shards) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  int gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&gpus));
  std::vector<int32_t> devices(shards);
  for (uint32_t i = 0; i < shards; ++i) devices[i] = static_cast<int32_t>(i % static_cast<uint32_t>(gpus));
  if (shards > 1) {
    o.devices = devices.data();
    o.n_devices = shards;
  }
  ssa::allow_repeated_shard_devices(static_cast<uint32_t>(gpus) < shards);
  ssa_runtime* rt = nullptr;
  ssa_bench::check(ssa_runtime_create(&o, &rt), "runtime");
  ssa::allow_repeated_shard_devices(false);
  return rt;
}

double rel_l2(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, ssa_dtype dt) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = dt == SSA_DTYPE_F16 ? ssa::f16_to_f32(a[i]) : ssa::bf16_to_f32(a[i]);
    const double y = dt == SSA_DTYPE_F16 ? ssa::f16_to_f32(b[i]) : ssa::bf16_to_f32(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return sqrt(num / den);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> contexts = {1048576, 2097152}, shard_counts = {2, 4};
  uint32_t batch = 16;
  int reps = 10;
  std::string configs = "paper,llama";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--contexts")) contexts = ssa_bench::parse_u64_list(argv[i + 1]);
    if (!strcmp(argv[i], "--shards")) shard_counts = ssa_bench::parse_u64_list(argv[i + 1]);
    if (!strcmp(argv[i], "--batch")) batch = static_cast<uint32_t>(atoi(argv[i + 1]));
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--configs")) configs = argv[i + 1];
  }
  int gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&gpus));
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  printf("# Sharded CUDA decode\n\n%d x %s; shards round robin over the GPUs; median of %d; one layer\n\n", gpus,
         prop.name, reps);
  printf("| shape | N | shards (GPUs) | method | batch | unsharded ms | sharded ms | sharded / unsharded | rel L2 |\n");
  printf("|---|---|---|---|---|---|---|---|---|\n");
  const ssa_method methods[] = {SSA_METHOD_DENSE, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA};
  for (const ssa_bench::Shape& c : ssa_bench::kCpuShapes) {
    if (!ssa_bench::wants_shape(configs, c)) continue;
    const ssa_session_config cfg = ssa_test::make_config(1, c.nq, c.nkv, c.d, c.dtype);
    const size_t row = size_t{c.nkv} * c.d;  // elements per token of K (and of V)
    for (const uint64_t n : contexts) {
      ssa_runtime* base_rt = make_runtime(1);
      ssa_session* base = nullptr;
      ssa_bench::check(ssa_session_create(base_rt, &cfg, &base), "session");
      std::vector<ssa_runtime*> rts;
      std::vector<ssa_session*> sharded;
      for (const uint64_t sc : shard_counts) {
        rts.push_back(make_runtime(static_cast<uint32_t>(sc)));
        ssa_session* s = nullptr;
        ssa_bench::check(ssa_session_create(rts.back(), &cfg, &s), "sharded session");
        sharded.push_back(s);
      }
      // The same rows into every session, 64K tokens an append.
      const uint64_t chunk = 65536;
      void *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
      CUDA_OK(cudaMalloc(&k, chunk * row * 2));
      CUDA_OK(cudaMalloc(&v, chunk * row * 2));
      CUDA_OK(cudaMalloc(&q, size_t{batch} * c.nq * c.d * 2));
      CUDA_OK(cudaMalloc(&out, size_t{batch} * c.nq * c.d * 2));
      for (uint64_t t = 0; t < n; t += chunk) {
        const uint64_t m = std::min(chunk, n - t);
        fill_device(k, m * row, c.dtype, 2 * (t / chunk) + 1);
        fill_device(v, m * row, c.dtype, 2 * (t / chunk) + 2);
        CUDA_OK(cudaDeviceSynchronize());
        ssa_bench::check(ssa_session_append(base, 0, k, v, m), "append");
        for (ssa_session* s : sharded) ssa_bench::check(ssa_session_append(s, 0, k, v, m), "sharded append");
      }
      fill_device(q, size_t{batch} * c.nq * c.d, c.dtype, 999);
      CUDA_OK(cudaDeviceSynchronize());
      const size_t qn = size_t{c.nq} * c.d;
      for (const ssa_method method : methods) {
        ssa_decode_params p;
        ssa_decode_params_init(&p);
        p.method = method;
        p.sparsity = 50.0f;
        for (const uint32_t b : {1u, batch}) {
          // Forks share the session's pages: batch b reads b copies' worth of rows.
          auto run = [&](ssa_session* s, std::vector<uint16_t>* first) {
            std::vector<ssa_session*> forks(b, s);
            for (uint32_t i = 1; i < b; ++i) ssa_bench::check(ssa_session_fork(s, &forks[i]), "fork");
            std::vector<ssa_decode_item> items(b);
            for (uint32_t i = 0; i < b; ++i) {
              items[i] = {forks[i], static_cast<uint16_t*>(q) + i * qn, static_cast<uint16_t*>(out) + i * qn};
            }
            std::vector<double> t;
            for (int r = -1; r < reps; ++r) {  // r = -1: trains the index, sizes the pools
              p.step = static_cast<uint64_t>(r + 1);
              CUDA_OK(cudaDeviceSynchronize());
              const double t0 = ssa_bench::now_us();
              ssa_bench::check(ssa_decode_batch(items.data(), b, 0, &p), "decode");
              CUDA_OK(cudaDeviceSynchronize());
              if (r >= 0) t.push_back((ssa_bench::now_us() - t0) / 1000.0);
              if (r == 0 && first != nullptr) {
                first->resize(qn);
                CUDA_OK(cudaMemcpy(first->data(), out, qn * 2, cudaMemcpyDeviceToHost));
              }
            }
            for (uint32_t i = 1; i < b; ++i) ssa_session_destroy(forks[i]);
            return ssa_bench::median(t);
          };
          std::vector<uint16_t> want, got;
          const double t_base = run(base, &want);
          for (size_t i = 0; i < sharded.size(); ++i) {
            const double t_sh = run(sharded[i], &got);
            printf("| %s | %llu | %llu (%d) | %s | %u | %.3f | %.3f | %.2f | %.1e |\n", c.name,
                   static_cast<unsigned long long>(n), static_cast<unsigned long long>(shard_counts[i]),
                   std::min<int>(gpus, static_cast<int>(shard_counts[i])), ssa_bench::method_name(method), b,
                   t_base, t_sh, t_sh / t_base, rel_l2(got, want, c.dtype));
            fflush(stdout);
          }
        }
      }
      CUDA_OK(cudaFree(k));
      CUDA_OK(cudaFree(v));
      CUDA_OK(cudaFree(q));
      CUDA_OK(cudaFree(out));
      for (ssa_session* s : sharded) ssa_session_destroy(s);
      for (ssa_runtime* rt : rts) ssa_runtime_destroy(rt);
      ssa_session_destroy(base);
      ssa_runtime_destroy(base_rt);
    }
  }
  return 0;
}
