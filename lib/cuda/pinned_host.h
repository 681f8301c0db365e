// Page-locked host memory that devices read in place (the host tier's pages):
// anonymous memory asked to be backed by transparent huge pages, then registered
// with CUDA as portable and mapped. Why not cudaHostAlloc: it page-locks about
// 3x faster (12 GiB in 1.8 s against 5.6 on an H100 machine). Random rows read
// in place over the bus are bounded per read by address translations, a bound
// that falls as the memory they are spread over grows; 2 MiB pages would give
// fewer, larger translations where a platform maps them so. On the machines
// measured the read rate did not move (bench/NOTEBOOK.md, "how fast random
// host rows can be read").
#pragma once

#include <stddef.h>

#include <cuda_runtime.h>

namespace ssa::cuda {

// `bytes` (> 0) of zeroed, page-locked, device-mapped host memory, 2 MiB-aligned,
// into *out (null on error): cudaErrorInvalidValue for 0 bytes,
// cudaErrorMemoryAllocation when the memory cannot be mapped, else the
// registration's own error.
cudaError_t pin_host(size_t bytes, void** out);

// Frees what pin_host gave, `bytes` as asked for then.
void unpin_host(void* p, size_t bytes);

}  // namespace ssa::cuda
