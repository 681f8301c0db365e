// Three-level proportional sampling: the context is split into chunks of
// kChunkTokens, chunks into blocks of kBlockTokens. A draw picks a chunk with
// probability (chunk weight / total), a block by its share of the chunk, then a
// token by its share of the block: the product is exactly w_i / total, yet each
// draw touches ~log2(#chunks) + 32 + 32 weights instead of the whole context.
// The CPU backend and the CUDA kernel call these same functions.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "host_device.h"

namespace ssa {

constexpr uint32_t kChunkTokens = 1024;
constexpr uint32_t kBlockTokens = 32;
constexpr uint32_t kBlocksPerChunk = kChunkTokens / kBlockTokens;

// Index of the first prefix entry > target in an inclusive prefix-sum array of n
// entries (binary search), skipping zero-weight entries. Clamped to the last entry
// with weight, so rounding at the top end never selects an empty entry.
template <typename W>
SSA_HD uint32_t pick_from_prefix(const W* inclusive_prefix, uint32_t n, W target) {
  uint32_t lo = 0, hi = n - 1;
  while (lo < hi) {  // smallest i with prefix[i] > target
    const uint32_t mid = lo + (hi - lo) / 2;
    if (inclusive_prefix[mid] > target) hi = mid; else lo = mid + 1;
  }
  // Only when target >= total (rounding) can lo land on trailing zero weights.
  while (lo > 0 && inclusive_prefix[lo] == inclusive_prefix[lo - 1]) --lo;
  return lo;
}

// Linear scan over n weights: first i whose running sum (in Acc) exceeds target;
// clamped to the last positive weight (rounding). Requires at least one positive
// weight.
template <typename W, typename Acc = double>
SSA_HD uint32_t pick_by_scan(const W* w, uint32_t n, Acc target) {
  Acc run = 0;
  uint32_t last_positive = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (w[i] > 0) {
      run += static_cast<Acc>(w[i]);
      last_positive = i;
      if (run > target) return i;
    }
  }
  return last_positive;
}

}  // namespace ssa
