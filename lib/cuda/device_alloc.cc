#if defined(SSA_HAVE_CUDA)

#include "device_alloc.h"

#include "fault_countdown.h"

namespace ssa::cuda {
namespace {
FaultCountdown g_faults;
}  // namespace

cudaError_t device_malloc_async(void** p, size_t bytes, cudaStream_t stream) {
  if (g_faults.fire()) return cudaErrorMemoryAllocation;
  return cudaMallocAsync(p, bytes, stream);
}

void set_device_alloc_failure_countdown(uint64_t n, bool sticky) { g_faults.arm(n, sticky); }
uint64_t device_alloc_calls_made() { return g_faults.calls(); }

}  // namespace ssa::cuda

#endif  // SSA_HAVE_CUDA
