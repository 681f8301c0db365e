// Pages in device memory: blocks of one size from the stream-ordered allocator,
// recycled through a small free list. A Page's data pointer is then a device
// address; its keeper returns the block here when the last reference goes
// (after every queued decode that read it: the CUDA backend's tables hold the
// keeper too).
#pragma once

#include <stddef.h>

#include <memory>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/device_budget.h"
#include "store/page.h"

namespace ssa::cuda {

class DevicePagePool : public std::enable_shared_from_this<DevicePagePool> {
 public:
  // device: where its pages live (< 0: the current device of each allocation).
  // bound: a budget whose pages these are (SharedPagePools); a freed block is then
  // kept only while the budget's charged bytes and the kept blocks fit it.
  static std::shared_ptr<DevicePagePool> create(size_t page_bytes, size_t max_free_pages = 64, int device = -1,
                                                std::shared_ptr<DeviceBudget> bound = nullptr);
  ~DevicePagePool();

  // A writable device page; SSA_ERR_OUT_OF_MEMORY when the allocation fails.
  // A new block is zeroed unless `zeroed` is false (the caller overwrites the
  // whole page before anything reads it).
  absl::StatusOr<PageRef> allocate(bool zeroed = true);
  // A writable device copy of `src` (device to device).
  absl::StatusOr<PageRef> copy_of(const Page& src);

 private:
  DevicePagePool(size_t page_bytes, size_t max_free, int device, std::shared_ptr<DeviceBudget> bound)
      : page_bytes_(page_bytes), max_free_(max_free), device_(device), bound_(std::move(bound)) {}
  void release(void* block);

  const size_t page_bytes_;
  const size_t max_free_;
  const int device_;
  const std::shared_ptr<DeviceBudget> bound_;
  absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

// The device K/V page pools of a runtime whose sessions trade a limited budget
// (lib/cuda/budget_trade.cc): one per page size and device, shared by its
// sessions. At a reservation, idle sessions give up device pages and the
// reserving one brings as many in; with a pool per session, each of those blocks
// went back to the stream-ordered allocator and came out of it again (a few
// microseconds a call, thousands of pages a turn). Shared, a page given up is the
// block the next one brought in takes. A pool keeps a freed block only while the
// budget's charged pages and the kept blocks fit the budget, so the runtime's K/V
// device memory stays within it; beyond, blocks go back to the allocator. A pool
// lives while a session or page of its size does; then its blocks go back.
class SharedPagePools {
 public:
  explicit SharedPagePools(std::shared_ptr<DeviceBudget> budget) : budget_(std::move(budget)) {}
  std::shared_ptr<DevicePagePool> get(size_t page_bytes, int device);

 private:
  const std::shared_ptr<DeviceBudget> budget_;
  absl::Mutex mu_;
  std::vector<std::tuple<size_t, int, std::weak_ptr<DevicePagePool>>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ssa::cuda
