// Pages in pinned host memory for tiered CUDA sessions (device_kv_budget). The
// memory is mapped into the device's address space, so a Page's data pointer is
// one the kernels read directly (over the bus, zero-copy) and the host writes
// through the same address. It is allocated in chunks of many pages as the
// pool grows, never as one huge pinned allocation (large pinned allocations
// fail or stall the whole process while the driver pins them), and chunks are
// kept until the pool goes: freed pages are recycled. With the runtime's
// pre-pinned chunks (pinned_chunks.h) a pool borrows those first and pins new
// chunks only when every one is lent; borrowed chunks go back to the runtime's
// pool when this pool goes, its own are freed.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pinned_chunks.h"
#include "store/page.h"

namespace ssa::cuda {

class PinnedPagePool : public std::enable_shared_from_this<PinnedPagePool> {
 public:
  // Chunks hold chunk_bytes (at least one page). reserve: the runtime's
  // pre-pinned chunks (null: none); used when a chunk of this pool fits in one.
  static std::shared_ptr<PinnedPagePool> create(size_t page_bytes, std::shared_ptr<PinnedChunkPool> reserve = nullptr,
                                                size_t chunk_bytes = PinnedChunkPool::kChunkBytes);
  ~PinnedPagePool();

  // A writable host-tier page; SSA_ERR_OUT_OF_MEMORY when no chunk can be pinned.
  absl::StatusOr<PageRef> allocate();
  // A writable host-tier copy of `src` (any tier).
  absl::StatusOr<PageRef> copy_of(const Page& src);

  size_t page_bytes() const { return page_bytes_; }
  // Bytes of chunks this pool holds so far (its own and borrowed ones).
  uint64_t pinned_bytes() const;
  // Of those, the bytes borrowed from the runtime's pre-pinned chunks.
  uint64_t borrowed_bytes() const;

 private:
  PinnedPagePool(size_t page_bytes, size_t chunk_pages, std::shared_ptr<PinnedChunkPool> reserve)
      : page_bytes_(page_bytes), chunk_pages_(chunk_pages), reserve_(std::move(reserve)) {}
  // A chunk of chunk_pages_ pages: borrowed when one is free, else pinned now.
  absl::StatusOr<void*> new_chunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void release(uint8_t* block);

  const size_t page_bytes_, chunk_pages_;
  // Null when chunks of this pool do not fit the runtime's (or there are none).
  const std::shared_ptr<PinnedChunkPool> reserve_;
  mutable absl::Mutex mu_;
  std::vector<void*> chunks_ ABSL_GUARDED_BY(mu_);    // pinned by this pool
  std::vector<void*> borrowed_ ABSL_GUARDED_BY(mu_);  // lent by reserve_
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
};

// Test hook: the n-th pinned page allocation from now (1-based) fails and, if
// `sticky`, all later ones too; n = 0 disarms.
void set_pinned_alloc_failure_countdown(uint64_t n, bool sticky);
uint64_t pinned_alloc_calls_made();

}  // namespace ssa::cuda
