#include "page_cache_policy.h"

#include <algorithm>

namespace ssa {

PageCachePolicy::Update PageCachePolicy::observe(const std::vector<PageReads>& reads, uint64_t step,
                                                 size_t max_admit) {
  Update u;
  std::vector<PageReads> misses;
  for (const PageReads& r : reads) {
    auto it = last_read_.find(r.page);
    if (it != last_read_.end()) {
      it->second = step;
    } else if (r.rows > 0) {
      misses.push_back(r);
    }
  }
  std::sort(misses.begin(), misses.end(), [](const PageReads& a, const PageReads& b) {
    return a.rows != b.rows ? a.rows > b.rows : a.page < b.page;
  });
  if (capacity_ == 0) return u;
  // Eviction candidates: least recently read first, lower page first on ties.
  std::vector<std::pair<uint64_t, uint64_t>> lru;  // (last read, page)
  for (const auto& [page, last] : last_read_)
    if (last < step) lru.emplace_back(last, page);
  std::sort(lru.begin(), lru.end());
  size_t next_victim = 0;
  for (const PageReads& m : misses) {
    if (u.admit.size() >= max_admit) break;
    if (last_read_.size() >= capacity_) {
      if (next_victim >= lru.size()) break;
      const uint64_t victim = lru[next_victim++].second;
      last_read_.erase(victim);
      u.evict.push_back(victim);
    }
    last_read_[m.page] = step;
    u.admit.push_back(m.page);
  }
  return u;
}

}  // namespace ssa
