// The fixed token splits of the CPU decode. Every partial result that the decode
// combines across tokens is a partial over one split of kSplitTokens tokens
// (split i = tokens [i * kSplitTokens, (i + 1) * kSplitTokens)), and the splits'
// partials are merged by log-sum-exp in split order. The splits do not depend
// on the thread count (results are bitwise reproducible whatever it is) nor on
// how a session is sharded: shard boundaries are multiples of kSplitTokens
// (lib/shard/shard_map.h), so a split never straddles two shards and a sharded
// decode merges the same partials in the same order (docs/SHARDING.md).
#pragma once

#include <stdint.h>

#include "common/sampling_hierarchy.h"

namespace ssa {

constexpr uint64_t kSplitTokens = 8192;

// The sampler's chunks (and so its blocks) never straddle a split either.
static_assert(kSplitTokens % kChunkTokens == 0, "splits hold whole sampler chunks");

inline uint64_t splits_for(uint64_t n_tokens) { return (n_tokens + kSplitTokens - 1) / kSplitTokens; }

}  // namespace ssa
