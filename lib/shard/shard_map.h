// Which tokens of a layer each shard holds. Shard i of a runtime's S shards holds
// tokens [i * B, (i + 1) * B) (B = shard_tokens), the last one every token from
// (S - 1) * B on: appends fill the last shard in use up to B, then the next one
// starts; a truncation empties the shards past its length. The map is a function
// of (layer length, S, B) alone, so a session needs no shard state of its own:
// fork, truncate, save and load keep working on the session's pages as they are,
// and a snapshot loaded by a runtime of another shard count or budget is sharded
// by that runtime's map. B is a multiple of kSplitTokens (so of every page size):
// every page and every decode split lies in one shard (the sampler's chunks,
// cut from sink_end, need not: see lib/cuda/sharded_decode.cc).
#pragma once

#include <stdint.h>

#include <vector>

#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

struct ShardRange {
  uint64_t begin = 0, end = 0;  // tokens [begin, end) of the layer; empty when begin == end
  uint64_t size() const { return end - begin; }
};

// The ranges of the n_shards shards of a layer of n_tokens tokens (some may be empty).
std::vector<ShardRange> shard_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens);

// The shard's part of `layer` as a layer of its own: its pages (shared, not copied),
// its codes and the layer's codebooks; its token t is token range.begin + t of
// the layer. range.begin must be a multiple of layout.page_tokens.
LayerStore shard_view(const KvLayout& layout, const LayerStore& layer, ShardRange range);

}  // namespace ssa
