// Attention of a layer's query heads as partials over the fixed splits of
// lib/decode/fixed_splits.h, for the unsharded and the sharded decode alike: a
// shard computes the partials of its own splits, and the partials of all splits,
// merged in split order, give bitwise the output of an unsharded decode.
#pragma once

#include <stdint.h>

#include <vector>

#include "cpu/attention.h"
#include "cpu/thread_pool.h"
#include "decode_buffers.h"
#include "decode_plan.h"
#include "select/selection.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

// parts[(kv * n_splits + i) * g + j]: the partial of query head kv * g + j over
// split i of `layer`, whose token 0 is token `origin` (a multiple of
// kSplitTokens) of the whole layer, n_splits = splits_for(layer.n_tokens).
// q: [n_q_heads][head_dim], pre-scaled.
//
// dense: every token of every split.
void dense_split_partials(const KvLayout& layout, const LayerStore& layer, const float* q, ThreadPool& pool,
                          std::vector<AttnPartial>* parts);

// sparse: the plan's sink and local rows (absolute tokens, clipped to this
// layer's part) and the selected rows of every query head (sels[h].tokens in
// this layer's own indices; with `shared`, sels[kv * g] serves the whole group,
// read once for all its heads). scratch: the group entries' buffers (any
// contents; lib/decode/decode_buffers.h).
void sparse_split_partials(const KvLayout& layout, const LayerStore& layer, uint64_t origin,
                           const DecodePlan& plan, const float* q, const std::vector<Selection>& sels,
                           bool shared, ThreadPool& pool, SplitEntries* scratch,
                           std::vector<AttnPartial>* parts);

// heads[h] = the merge of head h's partials in split order (parts laid out as
// above, n_splits per KV head).
void merge_split_partials(const KvLayout& layout, const std::vector<AttnPartial>& parts, uint64_t n_splits,
                          std::vector<AttnPartial>* heads);

}  // namespace ssa
