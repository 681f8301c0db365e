// Scores of a range of a layer's tokens for one query (pre-scaled by
// 1/sqrt(head_dim), so scores are attention logits): exact q . k for the oracle,
// else the PQ proxy through the layer's codebooks. Each token's score depends on
// its own key (or code) and the query alone, so a shard scoring its own tokens
// gets the values an unsharded decode gets for them.
#pragma once

#include <stdint.h>

#include <vector>

#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

// scores[t - t0] for tokens [t0, t1) of `layer` (indices of that layer's own
// pages), KV head kv_head; lut is scratch for the PQ lookup table.
void score_tokens(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                  ssa_method method, uint64_t t0, uint64_t t1, std::vector<float>* lut, float* scores);

// The same scores for the g query heads of KV head kv_head (q: g queries of
// head_dim floats), head j's in scores[j * stride + t - t0], each bitwise what
// score_tokens gives for that head. A chunk of tokens at a time is scored for
// every head before the next, so the codes (or keys) come from memory once per
// group rather than once per head: at long contexts the scan is bound by reading
// them.
void score_tokens_group(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                        uint32_t g, ssa_method method, uint64_t t0, uint64_t t1, std::vector<std::vector<float>>* luts,
                        float* scores, size_t stride);

}  // namespace ssa
