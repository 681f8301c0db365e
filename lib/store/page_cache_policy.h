// Which host-tier pages of one layer have a device copy in the session's cache
// (docs/TIERED_MEMORY.md). Host-only logic, tested without a GPU.
//
// After each decode the backend reports the host-tier pages it read and how
// many rows of each. Pages read by more rows are admitted first (the heavy set
// clusters and moves slowly from step to step; a page holding one sampled row
// is worth less), at most max_admit per decode, so that one decode never
// stalls on a large copy. When the cache is full, the entry read least
// recently makes room, provided it was not read at this decode (a page read
// now is not evicted for another read now).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <utility>
#include <vector>

namespace ssa {

class PageCachePolicy {
 public:
  explicit PageCachePolicy(size_t capacity_pages) : capacity_(capacity_pages) {}

  struct PageReads {
    uint64_t page;
    uint32_t rows;
  };
  struct Update {
    std::vector<uint64_t> admit;  // pages to copy in, in this order
    std::vector<uint64_t> evict;  // cached pages to drop first
  };

  // The host-tier pages read at `step` (cached or not; each page once).
  // Marks cached pages as read and decides admissions and evictions, which
  // the policy assumes done (call forget() for an admission that failed).
  Update observe(const std::vector<PageReads>& reads, uint64_t step, size_t max_admit);
  // The page is no longer cached (its copy failed, or the layer's page changed).
  void forget(uint64_t page) { last_read_.erase(page); }

  bool cached(uint64_t page) const { return last_read_.count(page) != 0; }
  size_t size() const { return last_read_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::map<uint64_t, uint64_t> last_read_;  // cached page -> step that last read it
};

}  // namespace ssa
