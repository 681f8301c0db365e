#include "shard_map.h"

#include <algorithm>

namespace ssa {

std::vector<ShardRange> shard_ranges(uint64_t n_tokens, uint32_t n_shards, uint64_t shard_tokens) {
  std::vector<ShardRange> r(n_shards);
  for (uint32_t i = 0; i < n_shards; ++i) {
    const uint64_t begin = std::min(n_tokens, uint64_t{i} * shard_tokens);
    const uint64_t end = i + 1 == n_shards ? n_tokens : std::min(n_tokens, uint64_t{i + 1} * shard_tokens);
    r[i] = ShardRange{begin, end};
  }
  return r;
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
