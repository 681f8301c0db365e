// The tokens of every layer a session keeps in this process. A session of a
// runtime that is one rank of a group of processes (docs/DISTRIBUTED.md) keeps
// only its shard's pages: its layers keep the whole length, with no page (a null
// PageRef) where another rank holds the tokens. Every other session keeps all.
// Shard boundaries are multiples of 8192 tokens, so of every page size: a page
// is held whole or not at all.
#pragma once

#include <stdint.h>

#include <algorithm>

namespace ssa {

struct HeldRange {
  uint64_t begin = 0, end = UINT64_MAX;  // tokens [begin, end); end UINT64_MAX: no end

  bool all() const { return begin == 0 && end == UINT64_MAX; }
  bool holds_page(uint64_t page, uint32_t page_tokens) const {
    // page * page_tokens < 2^32 * 2^12: no overflow for any layer's page.
    const uint64_t t = page * page_tokens;
    return t >= begin && t < end;
  }
  // The held tokens of [a, b): [lo(a), hi(b)), empty when lo >= hi.
  uint64_t lo(uint64_t a) const { return std::max(a, begin); }
  uint64_t hi(uint64_t b) const { return std::min(b, end); }
  // Whether any of the tokens [a, b) is held.
  bool overlaps(uint64_t a, uint64_t b) const { return lo(a) < hi(b); }
};

}  // namespace ssa
