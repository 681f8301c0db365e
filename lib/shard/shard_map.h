// Which tokens of a layer each shard holds. Shard i of a runtime's S shards holds
// tokens [i * B, (i + 1) * B) (B = shard_tokens), the last one every token from
// (S - 1) * B on: appends fill the last shard in use up to B, then the next one
// starts; a truncation empties the shards past its length. The map is a function
// of (layer length, S, B) alone, so a session needs no shard state of its own:
// fork, truncate, save and load keep working on the session's pages as they are,
// and a snapshot loaded by a runtime of another shard count or budget is sharded
// by that runtime's map. B is a multiple of kSplitTokens (so of every page size):
// every page and every decode split lies in one shard (the sampler's chunks,
// cut from sink_end, need not: see chunk_aligned_ranges).
#pragma once

#include <stdint.h>

#include <vector>

#include "store/held_range.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

struct ShardRange {
  uint64_t begin = 0, end = 0;  // tokens [begin, end) of the layer; empty when begin == end
  uint64_t size() const { return end - begin; }
};

// min(n_tokens, shard * shard_tokens), the first token of shard `shard` (or
// n_tokens when it holds none), without overflow for any shard_tokens >= 1.
uint64_t shard_begin(uint32_t shard, uint64_t shard_tokens, uint64_t n_tokens);

// The tokens shard `shard` of n_shards takes, whatever the layer's length:
// [shard B, (shard + 1) B), the last shard [shard B, no end); a bound past
// 2^64 is no bound. What a rank of a group of processes keeps (HeldRange).
HeldRange held_tokens(uint32_t shard, uint32_t n_shards, uint64_t shard_tokens);

// The ranges of the n_shards shards of a layer of n_tokens tokens (some may be empty).
std::vector<ShardRange> shard_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens);

// The ranges a decode that selects reads on each shard: shard i's own tokens,
// moved to start at the first chunk_tokens boundary of the candidates (counted
// from sink_end) at or after the shard's start, so that no chunk of a sampler cut
// from sink_end (the CUDA one, kernels/stratified_sample.cu) is split between
// shards; a range then ends where the next non-empty shard's starts (past its own
// shard's end: up to chunk_tokens - 1 tokens of the next shard), the first starts
// at 0, the last ends at n_tokens. A shard may get an empty range (its tokens all
// in the previous range). Every non-empty range starts inside its own shard
// (shard_tokens >= chunk_tokens), and together they cover [0, n_tokens) in order.
std::vector<ShardRange> chunk_aligned_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens,
                                             uint64_t sink_end, uint64_t chunk_tokens);

// The shard's part of `layer` as a layer of its own: its pages (shared, not copied),
// its codes and the layer's codebooks; its token t is token range.begin + t of
// the layer. range.begin must be a multiple of layout.page_tokens.
LayerStore shard_view(const KvLayout& layout, const LayerStore& layer, ShardRange range);

}  // namespace ssa
