// Pages in device memory: blocks of one size from the stream-ordered allocator,
// recycled through a small free list. A Page's data pointer is then a device
// address; its keeper returns the block here when the last reference goes
// (after every queued decode that read it: the CUDA backend's tables hold the
// keeper too).
#pragma once

#include <stddef.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/page.h"

namespace ssa::cuda {

class DevicePagePool : public std::enable_shared_from_this<DevicePagePool> {
 public:
  // device: where its pages live (< 0: the current device of each allocation).
  static std::shared_ptr<DevicePagePool> create(size_t page_bytes, size_t max_free_pages = 64, int device = -1);
  ~DevicePagePool();

  // A writable device page; SSA_ERR_OUT_OF_MEMORY when the allocation fails.
  // A new block is zeroed unless `zeroed` is false (the caller overwrites the
  // whole page before anything reads it).
  absl::StatusOr<PageRef> allocate(bool zeroed = true);
  // A writable device copy of `src` (device to device).
  absl::StatusOr<PageRef> copy_of(const Page& src);

 private:
  DevicePagePool(size_t page_bytes, size_t max_free, int device)
      : page_bytes_(page_bytes), max_free_(max_free), device_(device) {}
  void release(void* block);

  const size_t page_bytes_;
  const size_t max_free_;
  const int device_;
  absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ssa::cuda
