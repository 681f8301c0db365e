// What a rank of a CUDA group keeps beyond its shard. The CUDA sampler's
// hierarchy is cut into 1024-candidate chunks counted from sink_end, so a
// decode that selects reads on each shard a range moved to the first chunk
// boundary at or after the shard's start (chunk_aligned_ranges, shard_map.h):
// up to 1023 tokens past its own shard's end. In one process those rows are
// read from the next shard's device; a rank of a group of processes keeps
// them itself: every rank gets every appended row, and a CUDA rank keeps the
// pages of its shard and of the first kGroupMarginTokens tokens after it.
// Snapshots still write each page from its own shard's rank (runtime.h, own).
#pragma once

#include <stdint.h>

#include "shard/shard_map.h"
#include "store/held_range.h"

namespace ssa {

inline constexpr uint64_t kGroupMarginTokens = 1024;

// The tokens a CUDA rank keeps: its shard and the margin after it (the last
// shard has no end).
inline HeldRange held_with_margin(uint32_t rank, uint32_t n_ranks, uint64_t shard_tokens) {
  HeldRange h = held_tokens(rank, n_ranks, shard_tokens);
  if (h.end != UINT64_MAX) h.end = h.end > UINT64_MAX - kGroupMarginTokens ? UINT64_MAX : h.end + kGroupMarginTokens;
  return h;
}

}  // namespace ssa
