// Tiered K/V benchmark (docs/TIERED_MEMORY.md), through the public API as a user
// runs it. One run measures, in this order:
//   rates     host-to-device: a pinned cudaMemcpy of 1 GiB; zero-copy kernel
//             reads of random 1 KiB rows of mapped pinned memory; the device's
//             own copy bandwidth (the device part of the byte floor). And the
//             two ways of gathering the same rows into device staging instead
//             of reading them in place: one cudaMemcpyBatchAsync of all the
//             rows (the copy engines), and host threads gathering them into a
//             pinned staging buffer followed by one copy; plus the round trip
//             a staged decode adds (the selection's row list to the host and
//             back to a decode), a small read-back and a wait.
//   per shape (paper 16q/4kv/d256/f16, llama8b 32q/8kv/d128/bf16), tokens N:
//     sessions held wholly on the device, and tiered sessions whose runtime
//     budget is (1 - host_fraction) of their K/V (the rest on the host); batch
//     1 and B. Timed: SSA 50x on the device; SSA 50x tiered; DENSE tiered (the
//     offloading alternative when a session does not fit). Each timed decode
//     is one ssa_decode_batch on a drifting query (a new step each time: the
//     heavy set moves the way decoding moves it), wall clock around it with the
//     device idle before; median over the steps. One untimed decode per step
//     with stats gives rows read from the host, cache hits, and the tiered byte
//     floor: host bytes / zero-copy rate + device bytes / device bandwidth.
//   capacity  a runtime with a --capacity-budget (16 GiB) budget, eight paper-
//             shape sessions of N tokens (32 GiB of K/V at 1M) decoded as one batch.
//   file      (--file-dir DIR) per shape, one session saved to DIR, dropped from
//             the page cache (fsync, POSIX_FADV_DONTNEED), loaded with
//             SSA_LOAD_MMAP: its K/V stay in the file. Timed: the first SSA 50x
//             decode (its rows come from the disk), then SSA 50x and DENSE
//             steps (from the page cache where read before), then SSA 50x
//             again with the whole file in the page cache.
// The K/V are structured (bench/tier_workload.cuh): keys drawn around topic
// directions in bursts of consecutive tokens, queries near a few topics,
// drifting a little per step, so the heavy set clusters and moves slowly.
//
// Output: one JSON object per line on stdout (and --out FILE).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "common/dtype.h"
#include "tier_workload.cuh"
#include "cuda_check.cuh"

using namespace ssa_bench;

namespace {

FILE* g_out = nullptr;

void emit(const char* fmt, ...) {
  char buf[4096];
  va_list a;
  va_start(a, fmt);
  vsnprintf(buf, sizeof buf, fmt, a);
  va_end(a);
  fprintf(stdout, "%s\n", buf);
  fflush(stdout);
  if (g_out) {
    fprintf(g_out, "%s\n", buf);
    fflush(g_out);
  }
}

struct Rates {
  double pinned_h2d, zero_copy, device_copy;  // GB/s
  double dma_batch_rows, cpu_gather_rows, cpu_gather_only;  // GB/s, staged alternatives
  double round_trip_us;  // a 64 KiB read-back of a row list and its wait
  unsigned gather_threads;
};

// Row r's offset (in 1 KiB rows) in the source: the same hash as the kernel's.
__host__ __device__ inline uint64_t random_row(uint64_t r, uint64_t seed, uint64_t n_rows) {
  uint64_t h = (r + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h % n_rows;
}

__global__ void gather_rows_kernel(const uint4* __restrict__ src, uint64_t n_rows, uint64_t seed, uint32_t rows,
                                   unsigned long long* sink) {
  // One warp per row of 1 KiB: 32 lanes x 2 x 16 bytes.
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const uint4* row = src + random_row(warp, seed, n_rows) * 64;
  const uint4 a = row[lane], b = row[lane + 32];
  const unsigned long long x = a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  if (x == 0x12345678ull) atomicAdd(sink, 1ull);  // keeps the loads
}

Rates measure_rates() {
  Rates r{};
  const size_t bytes = size_t{1} << 30;
  void *host = nullptr, *dev = nullptr, *dev2 = nullptr;
  CUDA_OK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(host, 1, bytes);
  CUDA_OK(cudaMalloc(&dev, bytes));
  CUDA_OK(cudaMalloc(&dev2, bytes));
  unsigned long long* sink = nullptr;
  CUDA_OK(cudaMalloc(&sink, sizeof *sink));
  auto best_of = [](int n, auto&& f) {
    double best = 1e30;
    for (int i = 0; i < n; ++i) {
      CUDA_OK(cudaDeviceSynchronize());
      const double t0 = now_us();
      f();
      CUDA_OK(cudaDeviceSynchronize());
      best = std::min(best, now_us() - t0);
    }
    return best;
  };
  r.pinned_h2d = bytes / best_of(5, [&] { CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice)); }) / 1e3;
  r.device_copy =
      2.0 * bytes / best_of(5, [&] { CUDA_OK(cudaMemcpy(dev2, dev, bytes, cudaMemcpyDeviceToDevice)); }) / 1e3;
  const uint32_t rows = 1u << 18;  // 256 MiB of random 1 KiB rows out of 1 GiB
  uint64_t seed = 1;
  r.zero_copy = double(rows) * 1024 /
                best_of(5, [&] {
                  gather_rows_kernel<<<(rows * 32 + 255) / 256, 256>>>(static_cast<const uint4*>(host), bytes / 1024,
                                                                      seed++, rows, sink);
                }) /
                1e3;
  // Staged: the same number of random rows copied into device staging (dev).
  std::vector<void*> dsts(rows);
  std::vector<const void*> srcs(rows);
  std::vector<size_t> sizes(rows, 1024);
  auto plan_rows = [&](uint64_t sd) {
    for (uint32_t r = 0; r < rows; ++r) {
      srcs[r] = static_cast<const uint8_t*>(host) + random_row(r, sd, bytes / 1024) * 1024;
      dsts[r] = static_cast<uint8_t*>(dev) + size_t{r} * 1024;
    }
  };
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  plan_rows(seed);
  r.dma_batch_rows = double(rows) * 1024 /
                     best_of(5, [&] {
                       constexpr uint32_t kPerCall = 1u << 16;
                       for (uint32_t r0 = 0; r0 < rows; r0 += kPerCall)
                         CUDA_OK(cudaMemcpyBatchAsync(const_cast<void* const*>(dsts.data() + r0), srcs.data() + r0,
                                                      sizes.data() + r0, std::min(kPerCall, rows - r0), &attr,
                                                      &attr_index, 1, st));
                       CUDA_OK(cudaStreamSynchronize(st));
                     }) /
                     1e3;
  void* staging = nullptr;
  CUDA_OK(cudaHostAlloc(&staging, size_t{rows} * 1024, cudaHostAllocPortable));
  memset(staging, 0, size_t{rows} * 1024);
  r.gather_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  auto gather = [&] {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < r.gather_threads; ++t)
      pool.emplace_back([&, t] {
        for (uint32_t i = t; i < rows; i += r.gather_threads)
          memcpy(static_cast<uint8_t*>(staging) + size_t{i} * 1024, srcs[i], 1024);
      });
    for (std::thread& th : pool) th.join();
  };
  r.cpu_gather_only = double(rows) * 1024 / best_of(5, gather) / 1e3;
  r.cpu_gather_rows = double(rows) * 1024 /
                      best_of(5, [&] {
                        gather();
                        CUDA_OK(cudaMemcpy(dev, staging, size_t{rows} * 1024, cudaMemcpyHostToDevice));
                      }) /
                      1e3;
  r.round_trip_us = best_of(20, [&] {
    CUDA_OK(cudaMemcpyAsync(staging, dev2, 64 << 10, cudaMemcpyDeviceToHost, st));
    CUDA_OK(cudaStreamSynchronize(st));
  });
  cudaFreeHost(staging);
  cudaStreamDestroy(st);
  cudaFree(sink);
  cudaFree(dev2);
  cudaFree(dev);
  cudaFreeHost(host);
  return r;
}

struct ModelShape {
  const char* name;
  uint32_t nq, nkv, d;
  ssa_dtype dtype;
};
const ModelShape kShapes[] = {{"paper", 16, 4, 256, SSA_DTYPE_F16}, {"llama8b", 32, 8, 128, SSA_DTYPE_BF16}};

size_t elem(ssa_dtype t) { return t == SSA_DTYPE_F32 ? 4 : 2; }
uint64_t kv_bytes(const ModelShape& s, uint64_t n) { return 2 * n * s.nkv * s.d * elem(s.dtype); }

ssa_runtime* make_runtime(uint64_t budget) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = budget;
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(&o, &rt), "ssa_runtime_create");
  return rt;
}

// Sessions of one shape filled with the structured workload, appended in
// lockstep (chunk c of every session, then chunk c + 1), so that a shared
// budget is shared evenly, as among sessions that grow together.
std::vector<ssa_session*> make_sessions(ssa_runtime* rt, const ModelShape& s, uint64_t n, uint32_t count,
                                        const TierWorkload& w) {
  ssa_session_config c = ssa_test::make_config(1, s.nq, s.nkv, s.d, s.dtype);
  c.page_tokens = 256;
  c.index_min_tokens = 65536;
  c.index_regrow_factor = 4.0f;
  std::vector<ssa_session*> out(count);
  for (auto& x : out) check(ssa_session_create(rt, &c, &x), "ssa_session_create");
  const uint64_t chunk = 65536;
  const size_t row = size_t{s.nkv} * s.d * elem(s.dtype);
  void *k = nullptr, *v = nullptr;
  CUDA_OK(cudaMalloc(&k, chunk * row));
  CUDA_OK(cudaMalloc(&v, chunk * row));
  for (uint64_t t0 = 0; t0 < n; t0 += chunk) {
    const uint64_t m = std::min(chunk, n - t0);
    for (uint32_t i = 0; i < count; ++i) {
      w.generate(i, t0, m, k, v);
      check(ssa_session_append(out[i], 0, k, v, m), "ssa_session_append");
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);
  return out;
}

struct Timing {
  double ms = 0;                            // median wall time of one batch decode
  uint64_t tokens_read = 0, rows_from_host = 0, hits = 0;  // per decode (all items), medians' steps summed / steps
  double hit_rate_last = 0;                 // hits / host-tier rows at the last steps
  double floor_ms = 0;                      // tiered byte floor per decode
};

// `steps` timed batch decodes of `sessions` on drifting queries; stats from one
// untimed decode of each item per step.
Timing run(const std::vector<ssa_session*>& sessions, const ModelShape& s, TierWorkload& w, ssa_method m,
           uint32_t steps, const Rates& rates, uint64_t first_step) {
  const size_t qb = size_t{s.nq} * s.d * elem(s.dtype);
  const uint32_t B = static_cast<uint32_t>(sessions.size());
  void *q = nullptr, *o = nullptr;
  CUDA_OK(cudaMalloc(&q, qb * B));
  CUDA_OK(cudaMalloc(&o, qb * B));
  std::vector<ssa_decode_item> items(B);
  for (uint32_t i = 0; i < B; ++i)
    items[i] = ssa_decode_item{sessions[i], static_cast<uint8_t*>(q) + qb * i, static_cast<uint8_t*>(o) + qb * i};
  ssa_decode_params p = ssa_test::params(m, 0, 50.0f);
  std::vector<double> ms;
  Timing t;
  double host_bytes = 0, dev_bytes = 0;
  uint64_t last_hits = 0, last_host = 0;
  const size_t row_bytes = 2 * size_t{s.d} * elem(s.dtype);  // K and V of one head's row
  for (uint32_t step = 0; step < steps; ++step) {
    p.step = first_step + step;
    w.queries(p.step, B, q);
    CUDA_OK(cudaDeviceSynchronize());
    const double t0 = now_us();
    check(ssa_decode_batch(items.data(), B, 0, &p), "ssa_decode_batch");
    CUDA_OK(cudaDeviceSynchronize());
    ms.push_back((now_us() - t0) / 1e3);
    uint64_t read = 0, host = 0, hits = 0;
    for (uint32_t i = 0; i < B; ++i) {
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      check(ssa_decode(sessions[i], 0, items[i].q, items[i].out, &p, &st), "ssa_decode");
      read += st.tokens_read;
      host += st.rows_from_host;
      hits += st.host_cache_hits;
    }
    t.tokens_read += read;
    t.rows_from_host += host;
    t.hits += hits;
    host_bytes += double(host) * row_bytes;
    dev_bytes += double(read - host) * row_bytes;
    if (step + 4 >= steps) {
      last_hits += hits;
      last_host += host;
    }
  }
  t.ms = median(ms);
  t.tokens_read /= steps;
  t.rows_from_host /= steps;
  t.hits /= steps;
  t.hit_rate_last = last_hits + last_host ? double(last_hits) / double(last_hits + last_host) : 0.0;
  t.floor_ms = (host_bytes / steps / (rates.zero_copy * 1e9) + dev_bytes / steps / (rates.device_copy * 1e9)) * 1e3;
  cudaFree(q);
  cudaFree(o);
  return t;
}

void emit_timing(const char* shape, uint64_t n, uint32_t B, const char* what, ssa_method m, uint64_t budget,
                 const Timing& t) {
  emit("{\"record\":\"result\",\"shape\":\"%s\",\"tokens\":%llu,\"batch\":%u,\"placement\":\"%s\",\"method\":\"%s\","
       "\"sparsity\":50,\"device_kv_budget\":%llu,\"ms\":%.4f,\"tokens_read\":%llu,\"rows_from_host\":%llu,"
       "\"host_cache_hits\":%llu,\"hit_rate_last_steps\":%.4f,\"byte_floor_ms\":%.4f}",
       shape, (unsigned long long)n, B, what, method_name(m), (unsigned long long)budget, t.ms,
       (unsigned long long)t.tokens_read, (unsigned long long)t.rows_from_host, (unsigned long long)t.hits,
       t.hit_rate_last, t.floor_ms);
}

void destroy(std::vector<ssa_session*>& v) {
  for (ssa_session* s : v) ssa_session_destroy(s);
  v.clear();
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "paper,llama8b", out;
  uint64_t n = 1 << 20;
  uint32_t batch = 16, steps = 12;
  double host_fraction = 0.9;
  uint64_t capacity_budget = uint64_t{16} << 30;
  bool rates_only = false;
  std::string file_dir;
  bool skip_tiers = false;  // only the rates and the file tier
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", argv[i]);
        exit(2);
      }
      return argv[++i];
    };
    if (!strcmp(argv[i], "--shapes")) shapes = next();
    else if (!strcmp(argv[i], "--tokens")) n = strtoull(next(), nullptr, 10);
    else if (!strcmp(argv[i], "--batch")) batch = static_cast<uint32_t>(atoi(next()));
    else if (!strcmp(argv[i], "--steps")) steps = static_cast<uint32_t>(atoi(next()));
    else if (!strcmp(argv[i], "--host-fraction")) host_fraction = atof(next());
    else if (!strcmp(argv[i], "--capacity-budget")) capacity_budget = strtoull(next(), nullptr, 10);
    else if (!strcmp(argv[i], "--out")) out = next();
    else if (!strcmp(argv[i], "--rates-only")) rates_only = true;
    else if (!strcmp(argv[i], "--file-dir")) file_dir = next();
    else if (!strcmp(argv[i], "--skip-tiers")) skip_tiers = true;
    else {
      fprintf(stderr,
              "usage: gpu_tier_bench [--shapes paper,llama8b] [--tokens N] [--batch B] [--steps S]\n"
              "                      [--host-fraction F] [--capacity-budget BYTES] [--out FILE] [--rates-only]\n"
              "                      [--file-dir DIR] [--skip-tiers]\n");
      return 2;
    }
  }
  if (!out.empty()) g_out = fopen(out.c_str(), "w");
  int dev = 0;
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  emit("{\"record\":\"meta\",\"device\":\"%s\",\"tokens\":%llu,\"batch\":%u,\"steps\":%u,\"host_fraction\":%.3f}",
       prop.name, (unsigned long long)n, batch, steps, host_fraction);
  const Rates rates = measure_rates();
  emit("{\"record\":\"rates\",\"pinned_h2d_GBps\":%.2f,\"zero_copy_1KiB_rows_GBps\":%.2f,\"device_copy_GBps\":%.1f,"
       "\"dma_batch_1KiB_rows_GBps\":%.2f,\"cpu_gather_then_copy_1KiB_rows_GBps\":%.2f,"
       "\"cpu_gather_only_GBps\":%.2f,\"gather_threads\":%u,\"row_list_round_trip_us\":%.1f}",
       rates.pinned_h2d, rates.zero_copy, rates.device_copy, rates.dma_batch_rows, rates.cpu_gather_rows,
       rates.cpu_gather_only, rates.gather_threads, rates.round_trip_us);
  if (rates_only) {
    if (g_out) fclose(g_out);
    return 0;
  }

  for (const ModelShape& s : kShapes) {
    if (skip_tiers || shapes.find(s.name) == std::string::npos) continue;
    TierWorkload w(s.nq, s.nkv, s.d, s.dtype == SSA_DTYPE_BF16, 1234);
    for (uint32_t B : {1u, batch}) {
      const uint64_t budget = static_cast<uint64_t>((1.0 - host_fraction) * double(kv_bytes(s, n) * B));
      ssa_runtime* flat = make_runtime(0);
      ssa_runtime* tiered = make_runtime(budget);
      const double t0 = now_us();
      std::vector<ssa_session*> fs = make_sessions(flat, s, n, B, w);
      std::vector<ssa_session*> ts = make_sessions(tiered, s, n, B, w);
      emit("{\"record\":\"note\",\"shape\":\"%s\",\"batch\":%u,\"build_s\":%.1f}", s.name, B, (now_us() - t0) / 1e6);
      // DENSE tiered first: nothing of the tiered sessions is cached yet.
      const Timing dense = run(ts, s, w, SSA_METHOD_DENSE, 3, rates, 1);
      emit_timing(s.name, n, B, "tiered", SSA_METHOD_DENSE, budget, dense);
      const Timing on_device = run(fs, s, w, SSA_METHOD_SSA, steps, rates, 100);
      emit_timing(s.name, n, B, "device", SSA_METHOD_SSA, 0, on_device);
      const Timing t = run(ts, s, w, SSA_METHOD_SSA, steps, rates, 100);
      emit_timing(s.name, n, B, "tiered", SSA_METHOD_SSA, budget, t);
      emit("{\"record\":\"ratio\",\"shape\":\"%s\",\"batch\":%u,\"tiered_ssa_vs_tiered_dense\":%.2f,"
           "\"tiered_ssa_vs_device_ssa\":%.2f,\"tiered_ssa_vs_byte_floor\":%.2f}",
           s.name, B, dense.ms / t.ms, t.ms / on_device.ms, t.ms / t.floor_ms);
      destroy(ts);
      destroy(fs);
      ssa_runtime_destroy(tiered);
      ssa_runtime_destroy(flat);
    }
  }

  if (!skip_tiers && shapes.find("paper") != std::string::npos && capacity_budget > 0) {
    const ModelShape& s = kShapes[0];
    TierWorkload w(s.nq, s.nkv, s.d, false, 99);
    ssa_runtime* rt = make_runtime(capacity_budget);
    std::vector<ssa_session*> ss = make_sessions(rt, s, n, 8, w);
    const Timing t = run(ss, s, w, SSA_METHOD_SSA, steps, rates, 1);
    emit("{\"record\":\"capacity\",\"sessions\":8,\"tokens\":%llu,\"kv_GiB\":%.1f,\"budget_GiB\":%.1f,\"ms\":%.4f,"
         "\"rows_from_host\":%llu,\"host_cache_hits\":%llu,\"tokens_read\":%llu}",
         (unsigned long long)n, 8.0 * kv_bytes(s, n) / double(1ull << 30), double(capacity_budget) / double(1ull << 30),
         t.ms, (unsigned long long)t.rows_from_host, (unsigned long long)t.hits, (unsigned long long)t.tokens_read);
    destroy(ss);
    ssa_runtime_destroy(rt);
  }
  if (!file_dir.empty()) {
    for (const ModelShape& s : kShapes) {
      if (shapes.find(s.name) == std::string::npos) continue;
      TierWorkload w(s.nq, s.nkv, s.d, s.dtype == SSA_DTYPE_BF16, 4321);
      ssa_runtime* rt = make_runtime(0);
      const std::string path = file_dir + "/gpu_tier_bench_" + s.name + ".ssa";
      {
        std::vector<ssa_session*> made = make_sessions(rt, s, n, 1, w);
        check(ssa_session_save(made[0], path.c_str()), "ssa_session_save");
        destroy(made);
      }
      // Out of the page cache: the first decode reads its rows from the disk.
      const int fd = open(path.c_str(), O_RDONLY);
      if (fd < 0 || fsync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
        fprintf(stderr, "cannot drop %s from the page cache\n", path.c_str());
        return 1;
      }
      close(fd);
      int pageable = 0;
      CUDA_OK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
      std::vector<ssa_session*> ms(1);
      const double l0 = now_us();
      check(ssa_session_load(rt, path.c_str(), SSA_LOAD_MMAP, &ms[0]), "ssa_session_load(SSA_LOAD_MMAP)");
      const double load_ms = (now_us() - l0) / 1e3;
      const Timing cold = run(ms, s, w, SSA_METHOD_SSA, 1, rates, 500);
      const Timing warm = run(ms, s, w, SSA_METHOD_SSA, steps, rates, 501);
      const Timing dense = run(ms, s, w, SSA_METHOD_DENSE, 3, rates, 600);
      // DENSE read every page: the whole file is in the page cache now.
      const Timing cached = run(ms, s, w, SSA_METHOD_SSA, steps, rates, 700);
      emit("{\"record\":\"file_tier\",\"shape\":\"%s\",\"tokens\":%llu,\"kv_GiB\":%.2f,"
           "\"pageable_memory_access\":%d,\"load_ms\":%.2f,\"ssa_first_decode_ms\":%.3f,"
           "\"ssa_median_ms\":%.3f,\"ssa_rows_from_file\":%llu,\"ssa_tokens_read\":%llu,"
           "\"dense_median_ms\":%.3f,\"dense_rows_from_file\":%llu,\"ssa_page_cache_median_ms\":%.3f}",
           s.name, (unsigned long long)n, kv_bytes(s, n) / double(1ull << 30), pageable, load_ms, cold.ms, warm.ms,
           (unsigned long long)warm.rows_from_host, (unsigned long long)warm.tokens_read, dense.ms,
           (unsigned long long)dense.rows_from_host, cached.ms);
      destroy(ms);
      unlink(path.c_str());
      ssa_runtime_destroy(rt);
    }
  }
  if (g_out) fclose(g_out);
  return 0;
}
