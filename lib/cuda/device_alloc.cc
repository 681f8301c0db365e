#include "device_alloc.h"

#include <stdint.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "fault_countdown.h"

namespace ssa::cuda {
namespace {

FaultCountdown g_faults;

constexpr int kMaxDevices = 64;
absl::Mutex g_pools_mu;
cudaMemPool_t g_pools[kMaxDevices] ABSL_GUARDED_BY(g_pools_mu) = {};

// The current device's pool, created on first use; null if it cannot be (the
// caller then falls back to the default pool).
cudaMemPool_t current_pool() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return nullptr;
  }
  absl::MutexLock lock(&g_pools_mu);
  if (g_pools[device] != nullptr) return g_pools[device];
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // Keep what is freed (the default threshold, 0, returns it at every
  // synchronisation); device_pool_trim gives it back.
  uint64_t keep = UINT64_MAX;
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) cudaGetLastError();
  g_pools[device] = pool;
  return pool;
}

}  // namespace

cudaError_t device_malloc_async(void** p, size_t bytes, cudaStream_t stream) {
  if (g_faults.fire()) return cudaErrorMemoryAllocation;
  cudaMemPool_t pool = current_pool();
  if (pool == nullptr) return cudaMallocAsync(p, bytes, stream);
  return cudaMallocFromPoolAsync(p, bytes, pool, stream);
}

cudaError_t device_pool_share(int peer) {
  cudaMemPool_t pool = current_pool();
  if (pool == nullptr) return cudaErrorMemoryAllocation;
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  return cudaMemPoolSetAccess(pool, &access, 1);
}

void device_pool_trim() {
  cudaMemPool_t pool = current_pool();
  if (pool != nullptr && cudaMemPoolTrimTo(pool, 0) != cudaSuccess) cudaGetLastError();
}

uint64_t device_pool_bytes(bool used) {
  cudaMemPool_t pool = current_pool();
  uint64_t v = 0;  // the attribute is a 64-bit unsigned integer
  if (pool == nullptr ||
      cudaMemPoolGetAttribute(pool, used ? cudaMemPoolAttrUsedMemCurrent : cudaMemPoolAttrReservedMemCurrent, &v) !=
          cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

void set_device_alloc_failure_countdown(uint64_t n, bool sticky) { g_faults.arm(n, sticky); }
uint64_t device_alloc_calls_made() { return g_faults.calls(); }

}  // namespace ssa::cuda
