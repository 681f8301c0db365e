// Page copies in one launch (kernels/page_copy.h): a grid-stride loop over the
// 16-byte words of all pages, so each warp streams 512 contiguous bytes of one
// page and enough loads are in flight to keep the bus busy.
#include "page_copy.h"

#include <algorithm>

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) copy_pages_kernel(const PageCopy* list, uint32_t n, uint64_t words) {
  const uint64_t total = words * n;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < total; i += uint64_t{gridDim.x} * kThreads) {
    const uint64_t p = i / words, w = i % words;
    const PageCopy c = list[p];
    reinterpret_cast<uint4*>(c.dst)[w] = reinterpret_cast<const uint4*>(c.src)[w];
  }
}

}  // namespace

bool page_copies_aligned(const PageCopy* copies, size_t n, size_t bytes) {
  if (bytes % 16 != 0) return false;
  for (size_t i = 0; i < n; ++i) {
    if ((reinterpret_cast<uintptr_t>(copies[i].src) | reinterpret_cast<uintptr_t>(copies[i].dst)) % 16 != 0)
      return false;
  }
  return true;
}

cudaError_t launch_copy_pages(const PageCopy* list, uint32_t n, size_t bytes, cudaStream_t stream) {
  if (n == 0 || bytes == 0) return cudaSuccess;
  const uint64_t words = bytes / 16;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  // Eight blocks of 256 threads per multiprocessor: 64 warps, each with a 16-byte
  // load in flight, is about what a bus read needs to run at its rate.
  const uint64_t want = (words * n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(want, uint64_t{8} * std::max(sms, 1)));
  copy_pages_kernel<<<blocks, kThreads, 0, stream>>>(list, n, words);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
