#include "page_pool.h"

#include <stdlib.h>
#include <string.h>

#include "../alloc.h"
#include "../status.h"

namespace ssa {

std::shared_ptr<PagePool> PagePool::create(size_t page_bytes, size_t max_free_pages) {
  std::shared_ptr<PagePool> pool(new PagePool(page_bytes, max_free_pages));
  // release() runs in page destructors and must not allocate (it would throw
  // from a destructor when memory is exhausted): the free list never grows.
  pool->free_.reserve(max_free_pages);
  return pool;
}

PagePool::~PagePool() {
  for (void* p : free_) aligned_free(p);
}

absl::StatusOr<PageRef> PagePool::allocate() {
  void* block = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      block = free_.back();
      free_.pop_back();
    }
  }
  if (block == nullptr) {
    block = aligned_alloc_or_null(page_bytes_);
    if (block == nullptr) {
      return make_error(SSA_ERR_OUT_OF_MEMORY,
                        absl::StrCat("cannot allocate a page of ", page_bytes_, " bytes"));
    }
  }
  {
    std::lock_guard lock(mu_);
    ++live_;
  }
  // The keeper returns the block to this pool (kept alive by the keeper itself).
  std::shared_ptr<PagePool> self = shared_from_this();
  std::shared_ptr<void> keeper(block, [self](void* p) { self->release(p); });
  return std::make_shared<Page>(static_cast<uint8_t*>(block), page_bytes_, true,
                                std::move(keeper));
}

absl::StatusOr<PageRef> PagePool::copy_of(const Page& src) {
  absl::StatusOr<PageRef> page = allocate();
  if (!page.ok()) return page.status();
  memcpy((*page)->mutable_data(), src.data(), src.bytes() < page_bytes_ ? src.bytes() : page_bytes_);
  return page;
}

size_t PagePool::live_pages() const {
  std::lock_guard lock(mu_);
  return live_;
}

void PagePool::release(void* block) {
  std::lock_guard lock(mu_);
  --live_;
  if (free_.size() < max_free_) {
    free_.push_back(block);
    return;
  }
  aligned_free(block);
}

}  // namespace ssa
