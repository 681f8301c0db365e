// A fixed-size block of session storage (KV rows or PQ codes of page_tokens
// tokens). Pages are immutable once shared: sessions hold them by PageRef, a fork
// copies only the refs, and a writer that finds a page shared (or mapped from a
// read-only snapshot file) copies it first (copy-on-write).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>

namespace ssa {

// Where a page's bytes live (docs/TIERED_MEMORY.md). CPU sessions hold host or
// file pages; CUDA sessions device pages, and with a device budget host pages
// (pinned, mapped into the device's address space: kernels read them over the
// bus through the same pointer).
enum class PageTier : uint8_t { kHost = 0, kDevice = 1, kFile = 2 };

class Page {
 public:
  // `keeper` keeps the memory alive (a pool slot or a file mapping) and frees or
  // recycles it when the last reference to the page goes.
  Page(uint8_t* data, size_t bytes, bool writable, std::shared_ptr<void> keeper,
       PageTier tier = PageTier::kHost)
      : data_(data), bytes_(bytes), writable_(writable), tier_(tier), keeper_(std::move(keeper)) {}

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return writable_ ? data_ : nullptr; }
  size_t bytes() const { return bytes_; }
  bool writable() const { return writable_; }
  PageTier tier() const { return tier_; }
  // The memory's own lifetime, for readers that must keep the bytes (not the
  // page) alive: a copy delays recycling without counting as a sharer of the
  // page, so copy-on-write decisions are unaffected.
  const std::shared_ptr<void>& keeper() const { return keeper_; }

 private:
  uint8_t* data_;
  size_t bytes_;
  bool writable_;
  PageTier tier_;
  std::shared_ptr<void> keeper_;
};

using PageRef = std::shared_ptr<Page>;

}  // namespace ssa
