// Pages in pinned host memory for tiered CUDA sessions (device_kv_budget). The
// memory is mapped into the device's address space, so a Page's data pointer is
// one the kernels read directly (over the bus, zero-copy) and the host writes
// through the same address. It is allocated in chunks of many pages as the
// pool grows, never as one huge pinned allocation (large pinned allocations
// fail or stall the whole process while the driver pins them), and chunks are
// kept until the pool goes: freed pages are recycled.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/page.h"

namespace ssa::cuda {

class PinnedPagePool : public std::enable_shared_from_this<PinnedPagePool> {
 public:
  // Chunks hold chunk_bytes (at least one page).
  static std::shared_ptr<PinnedPagePool> create(size_t page_bytes, size_t chunk_bytes = size_t{64} << 20);
  ~PinnedPagePool();

  // A writable host-tier page; SSA_ERR_OUT_OF_MEMORY when no chunk can be pinned.
  absl::StatusOr<PageRef> allocate();
  // A writable host-tier copy of `src` (any tier).
  absl::StatusOr<PageRef> copy_of(const Page& src);

  size_t page_bytes() const { return page_bytes_; }
  // Bytes pinned in chunks so far.
  uint64_t pinned_bytes() const;

 private:
  PinnedPagePool(size_t page_bytes, size_t chunk_pages) : page_bytes_(page_bytes), chunk_pages_(chunk_pages) {}
  void release(uint8_t* block);

  const size_t page_bytes_, chunk_pages_;
  mutable absl::Mutex mu_;
  std::vector<void*> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
};

// Test hook: the n-th pinned page allocation from now (1-based) fails and, if
// `sticky`, all later ones too; n = 0 disarms.
void set_pinned_alloc_failure_countdown(uint64_t n, bool sticky);
uint64_t pinned_alloc_calls_made();

}  // namespace ssa::cuda
