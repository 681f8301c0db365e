// Whole pages copied between the device and pinned host memory in one launch
// (a tiered session's page moves: lib/cuda/device_tiers.cc, budget_trade.cc).
// A move brings in or sends out thousands of pages at once; one cudaMemcpyAsync
// per page costs microseconds of host time each, more than the page's transfer
// (a 256 KiB page crosses the bus in about 5 us). The kernel reads and writes host
// pages in place over the bus, as the decode kernels read host rows.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

namespace ssa::cuda {

struct PageCopy {
  const uint8_t* src;
  uint8_t* dst;
};

// Whether `copies` can go through launch_copy_pages: every address 16-byte
// aligned and `bytes` a multiple of 16 (else the caller copies page by page).
bool page_copies_aligned(const PageCopy* copies, size_t n, size_t bytes);

// Queues the copy of `bytes` from each src to its dst on `stream`. `list`: the n
// copies in device memory (read by the kernel), each address readable and
// writable by the device (device pages, pinned host pages); the pages must not
// overlap. Checked by page_copies_aligned first.
cudaError_t launch_copy_pages(const PageCopy* list, uint32_t n, size_t bytes, cudaStream_t stream);

}  // namespace ssa::cuda
