// Allocates pages of one size and recycles freed ones, so a session that grows,
// truncates and grows again reuses memory instead of returning to malloc, and a
// 1M-token session is a list of small blocks that never move or double.
#pragma once

#include <stddef.h>

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "page.h"

namespace ssa {

class PagePool : public std::enable_shared_from_this<PagePool> {
 public:
  static std::shared_ptr<PagePool> create(size_t page_bytes, size_t max_free_pages = 64);
  ~PagePool();

  // A writable page; SSA_ERR_OUT_OF_MEMORY on allocation failure.
  absl::StatusOr<PageRef> allocate();
  // A writable copy of `src` (same size), for copy-on-write.
  absl::StatusOr<PageRef> copy_of(const Page& src);

  size_t page_bytes() const { return page_bytes_; }
  size_t live_pages() const;

 private:
  PagePool(size_t page_bytes, size_t max_free_pages)
      : page_bytes_(page_bytes), max_free_(max_free_pages) {}
  void release(void* block);

  const size_t page_bytes_;
  const size_t max_free_;
  mutable std::mutex mu_;  // guards free_ and live_
  std::vector<void*> free_;
  size_t live_ = 0;
};

}  // namespace ssa
