// Page-locked host memory that devices read in place (the host tier's pages):
// anonymous memory asked to be backed by transparent huge pages, then registered
// with CUDA as portable and mapped. Why not cudaHostAlloc: random rows read in
// place over the bus are bounded per read by address translations, and the
// bound falls as the memory they are spread over grows (bench/NOTEBOOK.md,
// "how fast random host rows can be read"); memory in 2 MiB pages gives the
// translations fewer, larger entries where the platform maps them so.
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
