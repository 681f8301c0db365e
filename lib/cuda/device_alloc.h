// Every device allocation of the CUDA backend goes through here, so that tests
// can inject device-memory exhaustion (fail the n-th call) and check that each
// failure gives SSA_ERR_OUT_OF_MEMORY and leaves the session as it was.
#pragma once

#if defined(SSA_HAVE_CUDA)

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

namespace ssa::cuda {

// cudaMallocAsync (stream-ordered: cudaFree would wait for the whole device), or
// cudaErrorMemoryAllocation when a failure is injected.
cudaError_t device_malloc_async(void** p, size_t bytes, cudaStream_t stream);

// Test hook: the n-th device allocation from now (1-based) fails and, if
// `sticky`, all later ones too; n = 0 disarms.
void set_device_alloc_failure_countdown(uint64_t n, bool sticky);
uint64_t device_alloc_calls_made();

}  // namespace ssa::cuda

#endif  // SSA_HAVE_CUDA
