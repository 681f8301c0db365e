// Device memory of one call or one cache entry: taken from and returned to the
// library's stream-ordered pool (lib/cuda/device_alloc.h) in the order of one
// stream (cudaFree would wait for the whole device), and the page tables the
// kernels read (device arrays of page addresses).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "device_alloc.h"
#include "store/page.h"

namespace ssa::cuda {

// Freed on scope exit, on `stream`.
struct DeviceMem {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(stream, o.stream);
    return *this;
  }
  ~DeviceMem() {
    if (p) cudaFreeAsync(p, stream);
  }
  cudaError_t alloc(size_t bytes, cudaStream_t st) {
    stream = st;
    return device_malloc_async(&p, bytes ? bytes : 1, st);
  }
};

// Whether a device can read p directly: device memory (of any device) or managed.
bool is_device_memory(const void* p);

// A device array of the pointers of pages [first, first + count) (all by
// default), uploaded on st.
// A device copy of `bytes` bytes of host memory, uploaded on st.
absl::Status upload_array(const void* host, size_t bytes, cudaStream_t st, DeviceMem* out);

absl::Status upload_table(const std::vector<PageRef>& pages, bool writable, cudaStream_t st, DeviceMem* out,
                          size_t first = 0, size_t count = SIZE_MAX);

}  // namespace ssa::cuda
