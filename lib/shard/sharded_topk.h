// The global top-k of candidates spread over the shards of a group, each shard
// holding a contiguous range of them: the same set as topk_indices over all of
// them (the k largest by the order-preserving key of radix_topk.h, ties to the
// lowest token), found from all-reduced radix histograms without moving a score.
// Three histogram rounds (key bits 31-20, 19-8, 7-0) give the k-th largest key
// T exactly and how many of the set tie at T; one all-gather of the shards'
// counts of keys equal to T says which shard takes which of those ties (they go
// to the lowest tokens, so to the lowest shards first).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "cpu/thread_pool.h"
#include "collective.h"

namespace ssa {

struct TopkUnit {
  const float* x = nullptr;  // this shard's scores (its part of the candidates, in order)
  size_t n = 0;
  uint64_t k = 0;         // wanted over all shards
  uint64_t n_global = 0;  // candidates over all shards
};

// (*out)[u] = indices into units[u].x of this shard's members of unit u's top-k
// (increasing). Every rank calls it with the same unit count, k and n_global.
absl::Status sharded_topk(Collective& comm, ThreadPool& pool, const std::vector<TopkUnit>& units,
                          std::vector<std::vector<uint32_t>>* out);

}  // namespace ssa
