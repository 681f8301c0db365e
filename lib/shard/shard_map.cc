#include "shard_map.h"

#include <algorithm>

namespace ssa {

uint64_t shard_begin(uint32_t shard, uint64_t shard_tokens, uint64_t n_tokens) {
  // shard * shard_tokens may not fit in 64 bits (shard_tokens up to 2^64 - 8192):
  // compared by division instead, it is only formed when it is below n_tokens.
  if (shard == 0 || shard_tokens == 0) return 0;
  if (shard_tokens >= n_tokens || shard > (n_tokens - 1) / shard_tokens) return n_tokens;
  return uint64_t{shard} * shard_tokens;
}

HeldRange held_tokens(uint32_t shard, uint32_t n_shards, uint64_t shard_tokens) {
  auto bound = [&](uint64_t i) {
    return shard_tokens != 0 && i > UINT64_MAX / shard_tokens ? UINT64_MAX : i * shard_tokens;
  };
  HeldRange h;
  h.begin = bound(shard);
  h.end = shard + 1 >= n_shards ? UINT64_MAX : bound(uint64_t{shard} + 1);
  return h;
}

std::vector<ShardRange> shard_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens) {
  std::vector<ShardRange> r(n_shards);
  for (uint32_t i = 0; i < n_shards; ++i) {
    const uint64_t begin = shard_begin(i, shard_tokens, n_tokens);
    const uint64_t end = i + 1 == n_shards ? n_tokens : shard_begin(i + 1, shard_tokens, n_tokens);
    r[i] = ShardRange{begin, end};
  }
  return r;
}

std::vector<ShardRange> chunk_aligned_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens,
                                             uint64_t sink_end, uint64_t chunk_tokens) {
  const std::vector<ShardRange> own = shard_ranges(n_tokens, n_shards, shard_tokens);
  std::vector<uint64_t> start(own.size(), n_tokens);
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i].size() == 0) continue;
    uint64_t b = own[i].begin;
    if (b > 0) b = b <= sink_end ? sink_end : sink_end + (b - sink_end + chunk_tokens - 1) / chunk_tokens * chunk_tokens;
    start[i] = std::min(b, n_tokens);
  }
  std::vector<ShardRange> out(own.size());
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i].size() == 0) continue;
    uint64_t end = n_tokens;
    for (size_t j = i + 1; j < own.size(); ++j) {
      if (own[j].size() == 0) continue;
      end = start[j];
      break;
    }
    if (end > start[i]) out[i] = ShardRange{start[i], end};
  }
  return out;
}

LayerStore shard_view(const KvLayout& layout, const LayerStore& layer, ShardRange range) {
  LayerStore v;
  v.n_tokens = range.size();
  v.codebooks = layer.codebooks;
  v.trained_at_tokens = layer.trained_at_tokens;
  if (range.size() == 0) return v;
  const uint64_t p0 = range.begin / layout.page_tokens, p1 = layout.pages_for(range.end);
  v.kv_pages.assign(layer.kv_pages.begin() + p0, layer.kv_pages.begin() + p1);
  if (!layer.code_pages.empty()) {
    v.code_pages.assign(layer.code_pages.begin() + p0, layer.code_pages.begin() + p1);
  }
  return v;
}

}  // namespace ssa
