#include "pinned_pages.h"

#include <cuda_runtime.h>
#include <string.h>

#include "fault_countdown.h"
#include "pinned_host.h"
#include "status.h"

namespace ssa::cuda {
namespace {

FaultCountdown g_faults;

}  // namespace

std::shared_ptr<PinnedPagePool> PinnedPagePool::create(size_t page_bytes, std::shared_ptr<PinnedChunkPool> reserve,
                                                       size_t chunk_bytes) {
  const size_t pages = chunk_bytes / page_bytes > 0 ? chunk_bytes / page_bytes : 1;
  // Pages larger than the runtime's chunks: this pool pins its own.
  if (pages * page_bytes > PinnedChunkPool::kChunkBytes) reserve = nullptr;
  return std::shared_ptr<PinnedPagePool>(new PinnedPagePool(page_bytes, pages, std::move(reserve)));
}

PinnedPagePool::~PinnedPagePool() {
  // Every page is back (each holds the pool): no kernel can still read a chunk
  // whose pages were all released after their readers' events.
  for (void* c : chunks_) unpin_host(c, chunk_pages_ * page_bytes_);
  // Borrowed chunks go back as they came (fresh pinned memory is zero, as the
  // device pool zeroes its pages): the next session never sees this one's rows,
  // and the bytes past its rows are defined.
  for (void* c : borrowed_) {
    memset(c, 0, chunk_pages_ * page_bytes_);
    reserve_->give_back(c);
  }
}

uint64_t PinnedPagePool::pinned_bytes() const {
  absl::MutexLock lock(&mu_);
  return uint64_t{chunks_.size() + borrowed_.size()} * chunk_pages_ * page_bytes_;
}

uint64_t PinnedPagePool::borrowed_bytes() const {
  absl::MutexLock lock(&mu_);
  return uint64_t{borrowed_.size()} * chunk_pages_ * page_bytes_;
}

absl::StatusOr<void*> PinnedPagePool::new_chunk() {
  if (reserve_ != nullptr) {
    if (void* c = reserve_->take()) {
      borrowed_.push_back(c);
      return c;
    }
  }
  void* chunk = nullptr;
  const size_t bytes = chunk_pages_ * page_bytes_;
  // Portable: any device of the process may read it; mapped: through a
  // device address (the same as the host one under unified addressing).
  const cudaError_t e = pin_host(bytes, &chunk);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(SSA_ERR_OUT_OF_MEMORY,
                      absl::StrCat("pinned host allocation of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, chunk, 0) != cudaSuccess || dev != chunk) {
    // Without unified addressing the host and device addresses differ, and a
    // page has one data pointer: such systems keep every page on the device.
    cudaGetLastError();
    unpin_host(chunk, bytes);
    return make_error(SSA_ERR_UNSUPPORTED,
                      "pinned host memory is not addressed alike on host and device on this system");
  }
  chunks_.push_back(chunk);
  return chunk;
}

absl::StatusOr<PageRef> PinnedPagePool::allocate() {
  if (g_faults.fire()) {
    return make_error(SSA_ERR_OUT_OF_MEMORY, "pinned host allocation of a page failed (injected)");
  }
  uint8_t* block = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) {
      absl::StatusOr<void*> chunk = new_chunk();
      if (!chunk.ok()) return chunk.status();
      for (size_t i = chunk_pages_; i-- > 0;) free_.push_back(static_cast<uint8_t*>(*chunk) + i * page_bytes_);
    }
    block = free_.back();
    free_.pop_back();
  }
  std::shared_ptr<PinnedPagePool> self = shared_from_this();
  std::shared_ptr<void> keeper(block, [self](void* p) { self->release(static_cast<uint8_t*>(p)); });
  return std::make_shared<Page>(block, page_bytes_, true, std::move(keeper), PageTier::kHost);
}

absl::StatusOr<PageRef> PinnedPagePool::copy_of(const Page& src) {
  absl::StatusOr<PageRef> page = allocate();
  if (!page.ok()) return page.status();
  const cudaError_t e = cudaMemcpy((*page)->mutable_data(), src.data(),
                                   src.bytes() < page_bytes_ ? src.bytes() : page_bytes_, cudaMemcpyDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(SSA_ERR_DEVICE, absl::StrCat("page copy to the host tier: ", cudaGetErrorString(e)));
  }
  return page;
}

void PinnedPagePool::release(uint8_t* block) {
  absl::MutexLock lock(&mu_);
  free_.push_back(block);
}

void set_pinned_alloc_failure_countdown(uint64_t n, bool sticky) { g_faults.arm(n, sticky); }
uint64_t pinned_alloc_calls_made() { return g_faults.calls(); }

}  // namespace ssa::cuda
