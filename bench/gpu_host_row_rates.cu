// Zero-copy read rates of random rows of pinned host memory, by row size and by
// the size of the pinned memory the rows are spread over.
//
// A tiered decode reads the rows of its host pages in place over the bus
// (kernels/sparse_gather_attention.cu): per token a K row and a V row of one KV
// head (2 x head_dim x 2 bytes each; 256 B at Llama's d 128, bf16), scattered over
// the whole host tier (chunks of 64 MiB, lib/cuda/pinned_chunks.h). This bench
// tells how fast such reads can go, so the decode's host-row rate can be read
// against the bus rather than against a contiguous copy:
//   rows       random rows of R bytes (one 16-byte load per lane, R / 16 lanes a row)
//   pairs      random tokens' K row and V row of R bytes each, 512 KiB apart (a page's
//              K and V blocks at 256 tokens x 8 KV heads x d 128, bf16)
//   pool       GiB of pinned memory the rows are drawn from: cudaHostAlloc in 64 MiB
//              chunks (the host pool's memory before lib/cuda/pinned_host.h), one
//              cudaHostAlloc, or "thp": the library's own pinned memory (pin_host:
//              anonymous memory asked for transparent huge pages, then registered),
//              whether the mappings' page size moves the rate of random reads
// plus a pinned cudaMemcpy of 1 GiB (the bus's contiguous rate).
//
//   ./build-gpu/bench/gpu_host_row_rates [--pools 1,4,12] [--rows 128,256,512,1024]
//                                        [--allocs chunks,single,thp]
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>
#include "bench_util.h"
#include "cuda/pinned_host.h"
#include "cuda_check.cuh"
#include "tier_workload.cuh"  // mix64

namespace {

constexpr size_t kChunk = size_t{64} << 20;
constexpr size_t kPairGap = size_t{512} << 10;  // K block to V block of a page

// Read r: a row of `row` bytes at a random row-aligned offset of a random chunk
// (with pairs, also the row kPairGap after it, inside the same chunk).
__global__ void read_rows_kernel(const uint4* const* chunks, uint32_t n_chunks, uint32_t row, bool pairs,
                                 uint64_t n_reads, uint64_t seed, unsigned long long* sink) {
  const uint32_t lanes = row / 16;
  const uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint64_t r = t / lanes;
  if (r >= n_reads) return;
  const uint64_t h = ssa_bench::mix64((r + 1) * 0x9E3779B97F4A7C15ull ^ seed);
  const size_t span = pairs ? kChunk - kPairGap : kChunk;
  const uint4* base = chunks[h % n_chunks] + ((h >> 20) % (span / row)) * (row / 16);
  const uint32_t lane = static_cast<uint32_t>(t % lanes);
  uint4 a = base[lane];
  if (pairs) {
    const uint4 b = base[kPairGap / 16 + lane];
    a.x ^= b.x;
    a.w ^= b.w;
  }
  if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678u) atomicAdd(sink, 1ull);  // keeps the loads
}

double now_ms() { return ssa_bench::now_us() / 1e3; }

struct Pool {
  std::vector<void*> chunks;
  void* single = nullptr;
  bool registered = false;        // pin_host
  size_t bytes = 0;
  const uint4** table = nullptr;  // device copy of the chunk pointers
};

// Kilobytes of anonymous huge pages in the process's address space.
long anon_huge_kb() { return ssa_bench::proc_kib("/proc/self/smaps_rollup", "AnonHugePages:"); }

Pool make_pool(size_t gib, const std::string& alloc) {
  Pool p;
  const size_t n = gib * (size_t{1} << 30) / kChunk;
  p.bytes = n * kChunk;
  if (alloc == "single") {
    CUDA_OK(cudaHostAlloc(&p.single, n * kChunk, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(p.single, 1, n * kChunk);
    for (size_t i = 0; i < n; ++i) p.chunks.push_back(static_cast<uint8_t*>(p.single) + i * kChunk);
  } else if (alloc == "thp") {
    CUDA_OK(ssa::cuda::pin_host(p.bytes, &p.single));
    memset(p.single, 1, p.bytes);
    p.registered = true;
    for (size_t i = 0; i < n; ++i) p.chunks.push_back(static_cast<uint8_t*>(p.single) + i * kChunk);
  } else {
    for (size_t i = 0; i < n; ++i) {
      void* c = nullptr;
      CUDA_OK(cudaHostAlloc(&c, kChunk, cudaHostAllocMapped | cudaHostAllocPortable));
      memset(c, 1, kChunk);
      p.chunks.push_back(c);
    }
  }
  std::vector<const uint4*> dev(n);
  for (size_t i = 0; i < n; ++i) {
    void* d = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(&d, p.chunks[i], 0));
    dev[i] = static_cast<const uint4*>(d);
  }
  CUDA_OK(cudaMalloc(&p.table, n * sizeof(void*)));
  CUDA_OK(cudaMemcpy(p.table, dev.data(), n * sizeof(void*), cudaMemcpyHostToDevice));
  return p;
}

void free_pool(Pool& p) {
  CUDA_OK(cudaFree(p.table));
  if (p.registered) {
    ssa::cuda::unpin_host(p.single, p.bytes);
  } else if (p.single) {
    CUDA_OK(cudaFreeHost(p.single));
  } else {
    for (void* c : p.chunks) CUDA_OK(cudaFreeHost(c));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> pools{1, 4, 12}, rows{128, 256, 512, 1024};
  std::vector<std::string> allocs{"chunks"};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--pools") && i + 1 < argc) pools = ssa_bench::parse_u64_list(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = ssa_bench::parse_u64_list(argv[++i]);
    else if (!strcmp(argv[i], "--allocs") && i + 1 < argc) {
      allocs.clear();
      for (char* t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) allocs.push_back(t);
    } else {
      fprintf(stderr, "usage: %s [--pools 1,4,12] [--rows 128,256,512,1024] [--allocs chunks,single,thp]\n", argv[0]);
      return 2;
    }
  }
  for (const std::string& a : allocs) {
    if (a != "chunks" && a != "single" && a != "thp") {
      fprintf(stderr, "allocs are chunks, single and thp\n");
      return 2;
    }
  }
  for (uint64_t r : rows) {
    if (r < 16 || r > 512 * 16 || r % 16 || (r & (r - 1))) {
      fprintf(stderr, "row sizes are powers of two from 16 to 8192 bytes\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  unsigned long long* sink = nullptr;
  CUDA_OK(cudaMalloc(&sink, sizeof *sink));
  {
    const size_t bytes = size_t{1} << 30;
    void *h = nullptr, *d = nullptr;
    CUDA_OK(cudaHostAlloc(&h, bytes, cudaHostAllocPortable));
    memset(h, 1, bytes);
    CUDA_OK(cudaMalloc(&d, bytes));
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      const double t0 = now_ms();
      CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
      best = std::min(best, now_ms() - t0);
    }
    printf("{\"record\":\"copy\",\"device\":\"%s\",\"pinned_h2d_GBps\":%.2f}\n", prop.name, bytes / best / 1e6);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(h));
  }
  const uint64_t read_bytes = uint64_t{256} << 20;  // per measurement
  for (uint64_t gib : pools) {
    for (const std::string& alloc : allocs) {
      const long huge_before = anon_huge_kb();
      const double t_pin = now_ms();
      Pool p = make_pool(gib, alloc);
      const double pin_ms = now_ms() - t_pin;
      const long huge_kb = anon_huge_kb() - huge_before;
      for (int pairs = 0; pairs <= 1; ++pairs) {
        for (uint64_t r : rows) {
          const uint64_t n_reads = read_bytes / (r * (pairs ? 2 : 1));
          const uint64_t threads = n_reads * (r / 16);
          const uint32_t block = 256;
          const uint32_t grid = static_cast<uint32_t>((threads + block - 1) / block);
          double best = 1e30;
          for (int i = 0; i < 4; ++i) {  // the first one warms the mappings up
            CUDA_OK(cudaDeviceSynchronize());
            const double t0 = now_ms();
            read_rows_kernel<<<grid, block>>>(p.table, static_cast<uint32_t>(p.chunks.size()), static_cast<uint32_t>(r),
                                              pairs == 1, n_reads,
                                              1000 + i, sink);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            if (i > 0) best = std::min(best, now_ms() - t0);
          }
          printf("{\"record\":\"rows\",\"pool_GiB\":%d,\"alloc\":\"%s\",\"pattern\":\"%s\",\"row_bytes\":%d,"
                 "\"GBps\":%.2f,\"Mreads_per_s\":%.1f,\"pin_s\":%.1f,\"anon_huge_GiB\":%.2f}\n",
                 static_cast<int>(gib), alloc.c_str(), pairs ? "K+V pairs" : "rows", static_cast<int>(r),
                 read_bytes / best / 1e6,
                 n_reads * (pairs ? 2 : 1) / best / 1e3, pin_ms / 1e3, huge_kb / 1048576.0);
          fflush(stdout);
        }
      }
      free_pool(p);
    }
  }
  CUDA_OK(cudaFree(sink));
  return 0;
}
