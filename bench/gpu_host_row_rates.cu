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
//   adjacent   the same pairs with the V row right after the K row (one 2R-byte span,
//              inside one 4 KiB page): what a token-interleaved host layout would read,
//              so whether a pair costs one address translation or two
//   pool       GiB of pinned memory the rows are drawn from: cudaHostAlloc in 64 MiB
//              chunks (the host pool's memory before lib/cuda/pinned_host.h), one
//              cudaHostAlloc, or "thp": the library's own pinned memory (pin_host:
//              anonymous memory asked for transparent huge pages, then registered),
//              whether the mappings' page size moves the rate of random reads
// plus a pinned cudaMemcpy of 1 GiB (the bus's contiguous rate), and with --moves
// a tiered session's page moves (lib/cuda/device_tiers.cc, kernels/page_copy.cu):
// 2 GiB of random 1 MiB pages of the pool to the device, back to the host, and
// both at once (half each way, one launch), by the library's copy kernel and by a
// cudaMemcpyAsync per page.
//
//   ./build-gpu/bench/gpu_host_row_rates [--pools 1,4,12] [--rows 128,256,512,1024]
//                                        [--allocs chunks,single,thp] [--moves]
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
#include "kernels/page_copy.h"
#include "cuda_check.cuh"
#include "tier_workload.cuh"  // mix64

namespace {

constexpr size_t kChunk = size_t{64} << 20;
constexpr size_t kPairGap = size_t{512} << 10;  // K block to V block of a page

// What one read takes: a row, a K/V pair a page's blocks apart, or a pair side by side.
struct Pattern {
  const char* name;
  bool pair, adjacent;
  uint32_t gap(uint64_t row) const {  // bytes from the K row to the V row (0: no V row)
    return !pair ? 0u : adjacent ? static_cast<uint32_t>(row) : static_cast<uint32_t>(kPairGap);
  }
  uint32_t rows_per_read() const { return pair ? 2u : 1u; }
};
constexpr Pattern kPatterns[] = {{"rows", false, false}, {"K+V pairs", true, false}, {"K+V adjacent", true, true}};

// Read r: a row of `row` bytes at a random offset of a random chunk, aligned to
// the pair's span (with gap > 0, also the row `gap` bytes after it, inside the same
// chunk).
__global__ void read_rows_kernel(const uint4* const* chunks, uint32_t n_chunks, uint32_t row, uint32_t gap,
                                 uint64_t n_reads, uint64_t seed, unsigned long long* sink) {
  const bool pairs = gap > 0;
  const uint32_t lanes = row / 16;
  const uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint64_t r = t / lanes;
  if (r >= n_reads) return;
  const uint64_t h = ssa_bench::mix64((r + 1) * 0x9E3779B97F4A7C15ull ^ seed);
  const size_t stride = gap == row ? 2 * row : row;  // adjacent pairs never share a row
  const size_t span = gap == kPairGap ? kChunk - kPairGap : kChunk;
  const uint4* base = chunks[h % n_chunks] + ((h >> 20) % (span / stride)) * (stride / 16);
  const uint32_t lane = static_cast<uint32_t>(t % lanes);
  uint4 a = base[lane];
  if (pairs) {
    const uint4 b = base[gap / 16 + lane];
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

// Page moves between the pool and device memory: `dirs` 0 host to device, 1
// device to host, 2 both (even pages in, odd pages out). Prints GB/s of the bytes
// moved, best of 3 after a warm-up.
void page_moves(const Pool& p, const char* alloc, int gib) {
  constexpr size_t kPage = size_t{1} << 20;
  constexpr size_t kPages = 2048;
  const size_t per_chunk = kChunk / kPage;
  if (p.chunks.size() * per_chunk < kPages) return;  // fewer distinct pages than moves
  uint8_t* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, kPages * kPage));
  // Distinct pages spread over the pool: chunk i mod n, then the next page slot.
  std::vector<uint8_t*> host(kPages);
  for (size_t i = 0; i < kPages; ++i)
    host[i] = static_cast<uint8_t*>(p.chunks[i % p.chunks.size()]) + (i / p.chunks.size()) * kPage;
  ssa::cuda::PageCopy* list = nullptr;
  CUDA_OK(cudaMalloc(&list, kPages * sizeof(ssa::cuda::PageCopy)));
  for (int dirs = 0; dirs < 3; ++dirs) {
    std::vector<ssa::cuda::PageCopy> copies(kPages);
    for (size_t i = 0; i < kPages; ++i) {
      uint8_t* hp = nullptr;
      CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hp), host[i], 0));
      const bool in = dirs == 0 || (dirs == 2 && i % 2 == 0);
      copies[i] = in ? ssa::cuda::PageCopy{hp, dev + i * kPage} : ssa::cuda::PageCopy{dev + i * kPage, hp};
    }
    CUDA_OK(cudaMemcpy(list, copies.data(), kPages * sizeof(copies[0]), cudaMemcpyHostToDevice));
    for (int how = 0; how < 2; ++how) {  // the copy kernel, a cudaMemcpyAsync per page
      double best = 1e30;
      for (int r = 0; r < 4; ++r) {
        CUDA_OK(cudaDeviceSynchronize());
        const double t0 = now_ms();
        if (how == 0) {
          CUDA_OK(ssa::cuda::launch_copy_pages(list, kPages, kPage, nullptr));
        } else {
          for (const auto& c : copies) CUDA_OK(cudaMemcpyAsync(c.dst, c.src, kPage, cudaMemcpyDefault, nullptr));
        }
        CUDA_OK(cudaDeviceSynchronize());
        if (r > 0) best = std::min(best, now_ms() - t0);
      }
      printf("{\"record\":\"page_moves\",\"pool_GiB\":%d,\"alloc\":\"%s\",\"direction\":\"%s\",\"by\":\"%s\","
             "\"pages\":%zu,\"page_bytes\":%zu,\"GBps\":%.2f}\n",
             gib, alloc, dirs == 0 ? "to device" : dirs == 1 ? "to host" : "both", how == 0 ? "kernel" : "memcpy per page",
             kPages, kPage, kPages * kPage / best / 1e6);
      fflush(stdout);
    }
  }
  CUDA_OK(cudaFree(list));
  CUDA_OK(cudaFree(dev));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> pools{1, 4, 12}, rows{128, 256, 512, 1024};
  std::vector<std::string> allocs{"chunks"};
  bool moves = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--pools") && i + 1 < argc) pools = ssa_bench::parse_u64_list(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = ssa_bench::parse_u64_list(argv[++i]);
    else if (!strcmp(argv[i], "--moves")) moves = true;
    else if (!strcmp(argv[i], "--allocs") && i + 1 < argc) {
      allocs.clear();
      for (char* t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) allocs.push_back(t);
    } else {
      fprintf(stderr, "usage: %s [--pools 1,4,12] [--rows 128,256,512,1024] [--allocs chunks,single,thp] [--moves]\n",
              argv[0]);
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
      for (const Pattern& pattern : kPatterns) {
        for (uint64_t r : rows) {
          const uint32_t gap = pattern.gap(r);
          const uint64_t n_reads = read_bytes / (r * pattern.rows_per_read());
          const uint64_t threads = n_reads * (r / 16);
          const uint32_t block = 256;
          const uint32_t grid = static_cast<uint32_t>((threads + block - 1) / block);
          double best = 1e30;
          for (int i = 0; i < 4; ++i) {  // the first one warms the mappings up
            CUDA_OK(cudaDeviceSynchronize());
            const double t0 = now_ms();
            read_rows_kernel<<<grid, block>>>(p.table, static_cast<uint32_t>(p.chunks.size()), static_cast<uint32_t>(r),
                                              gap, n_reads,
                                              1000 + i, sink);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            if (i > 0) best = std::min(best, now_ms() - t0);
          }
          printf("{\"record\":\"rows\",\"pool_GiB\":%d,\"alloc\":\"%s\",\"pattern\":\"%s\",\"row_bytes\":%d,"
                 "\"GBps\":%.2f,\"Mreads_per_s\":%.1f,\"pin_s\":%.1f,\"anon_huge_GiB\":%.2f}\n",
                 static_cast<int>(gib), alloc.c_str(), pattern.name, static_cast<int>(r), read_bytes / best / 1e6,
                 n_reads * pattern.rows_per_read() / best / 1e3, pin_ms / 1e3, huge_kb / 1048576.0);
          fflush(stdout);
        }
      }
      if (moves) page_moves(p, alloc.c_str(), static_cast<int>(gib));
      free_pool(p);
    }
  }
  CUDA_OK(cudaFree(sink));
  return 0;
}
