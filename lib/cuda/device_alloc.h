// Every device allocation of the CUDA backend goes through here, for two reasons:
//  - the memory comes from a stream-ordered pool of the library's own, one per
//    device, that keeps freed memory for reuse. The device's default pool gives
//    unused memory back to the driver at every synchronisation, so each decode
//    after a wait would map its workspace again (a cost that grows with the
//    context) and each append its small tables; and changing the default pool would change the
//    embedding program's own allocations.
//  - tests can inject device-memory exhaustion (fail the n-th call) and check that
//    each failure gives SSA_ERR_OUT_OF_MEMORY and leaves the session as it was.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

namespace ssa::cuda {

// Stream-ordered allocation from the current device's library pool (cudaFree
// would wait for the whole device), or cudaErrorMemoryAllocation when a failure
// is injected. Freed with cudaFreeAsync.
cudaError_t device_malloc_async(void** p, size_t bytes, cudaStream_t stream);

// Lets kernels and copies on device `peer` read and write what the current
// device's pool hands out (a pool's memory is its own device's only, peer access
// or not): the shards of a sharded session read each other's pages and buffers.
cudaError_t device_pool_share(int peer);

// Gives the memory the current device's pool holds unused back to the driver
// (when a session goes, so that what it used is not kept for the process's life).
void device_pool_trim();

// Test hook: the bytes the current device's pool holds from the driver
// (reserved) or has handed out (used); 0 before its first allocation.
uint64_t device_pool_bytes(bool used);

// Test hook: the n-th device allocation from now (1-based) fails and, if
// `sticky`, all later ones too; n = 0 disarms.
void set_device_alloc_failure_countdown(uint64_t n, bool sticky);
uint64_t device_alloc_calls_made();

}  // namespace ssa::cuda
