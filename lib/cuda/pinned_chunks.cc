#include "pinned_chunks.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cuda_backend.h"
#include "device_error.h"
#include "device_guard.h"
#include "fault_countdown.h"
#include "pinned_host.h"
#include "runtime.h"
#include "status.h"

namespace ssa::cuda {
namespace {

FaultCountdown g_faults;
std::atomic<uint64_t> g_live{0};

void free_chunks(const std::vector<void*>& chunks) {
  for (void* c : chunks) {
    unpin_host(c, PinnedChunkPool::kChunkBytes);
    g_live.fetch_sub(PinnedChunkPool::kChunkBytes);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<PinnedChunkPool>> PinnedChunkPool::create(uint64_t bytes) {
  if (bytes == 0 || bytes % kChunkBytes != 0) {
    return invalid_argument("host_pool_bytes ", bytes, " must be a positive multiple of ", kChunkBytes);
  }
  std::vector<void*> chunks;
  chunks.reserve(bytes / kChunkBytes);
  for (uint64_t i = 0; i < bytes / kChunkBytes; ++i) {
    void* chunk = nullptr;
    // Flags as PinnedPagePool's own chunks: any device of the process may read
    // it, through the same address as the host.
    const cudaError_t e = g_faults.fire() ? cudaErrorMemoryAllocation
                                          : pin_host(kChunkBytes, &chunk);
    if (e != cudaSuccess) {
      cudaGetLastError();
      free_chunks(chunks);
      return make_error(SSA_ERR_OUT_OF_MEMORY,
                        absl::StrCat("host_pool_bytes: page-locking chunk ", i + 1, " of ", bytes / kChunkBytes,
                                     " (", kChunkBytes, " bytes each): ", cudaGetErrorString(e)));
    }
    g_live.fetch_add(kChunkBytes);
    chunks.push_back(chunk);
    void* dev = nullptr;
    if (cudaHostGetDevicePointer(&dev, chunk, 0) != cudaSuccess || dev != chunk) {
      cudaGetLastError();
      free_chunks(chunks);
      return make_error(SSA_ERR_UNSUPPORTED,
                        "host_pool_bytes: pinned host memory is not addressed alike on host and device on this system");
    }
  }
  return std::shared_ptr<PinnedChunkPool>(new PinnedChunkPool(std::move(chunks)));
}

PinnedChunkPool::~PinnedChunkPool() {
  // Every session pool that borrowed a chunk holds this pool: all are back.
  free_chunks(chunks_);
}

void* PinnedChunkPool::take() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return nullptr;
  void* c = free_.back();
  free_.pop_back();
  return c;
}

void PinnedChunkPool::give_back(void* chunk) {
  absl::MutexLock lock(&mu_);
  free_.push_back(chunk);
}

uint64_t PinnedChunkPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return uint64_t{free_.size()} * kChunkBytes;
}

absl::Status CudaBackend::reserve_host_pool(ssa_runtime& rt, uint64_t bytes) const {
  const DeviceGuard on(rt.device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  absl::StatusOr<std::shared_ptr<PinnedChunkPool>> pool = PinnedChunkPool::create(bytes);
  if (!pool.ok()) return pool.status();
  rt.host_pool = *std::move(pool);
  return absl::OkStatus();
}

void set_pinned_chunk_failure_countdown(uint64_t n, bool sticky) { g_faults.arm(n, sticky); }
uint64_t pinned_chunk_bytes_live() { return g_live.load(); }

}  // namespace ssa::cuda
