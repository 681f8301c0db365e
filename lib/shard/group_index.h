// The PQ index of a session of a group of processes (docs/DISTRIBUTED.md):
// every rank trains the same codebooks, bitwise those of an unsharded session
// of the same rows. Each rank holds only its shard's keys, so the training
// sample (the keys of tokens spread evenly over the whole layer,
// lib/index/pq_index.h) is gathered over the group: each rank reads the sample
// keys of its own tokens and one all-gather per chunk gives every rank all of
// them, in sample order. Then every rank trains on the same keys with the same
// deterministic k-means (whatever its thread count) and encodes its own keys.
// Gathering the sample was chosen over training on one rank and broadcasting
// the codebooks: the sample must cross the group either way, and training
// everywhere at once costs the group the time of one training, with no rank
// idle and no second exchange.
#pragma once

#include <stdint.h>

#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "callback_collective.h"
#include "cpu/thread_pool.h"
#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

// Reads the sample keys [i0, i1) of this rank's tokens (all held by it) into
// keys[h][i1 - i0][d] as floats (read_sample_keys on host pages; a CUDA rank
// copies them from its device pages).
using SampleKeyReader = absl::FunctionRef<absl::Status(uint64_t i0, uint64_t i1, float* keys)>;

// keys[h][n][d] = the n sample keys of a layer of n_tokens (its ranks hold the
// tokens of shard_tokens each, rank i shard i), as floats, on every rank.
// Exchanges: one all-gather per 1024 sample keys of the rank holding the most.
// A failure part way (a callback, this rank's memory or its reader) leaves the
// group out of step. Caller holds the group's call mutex (group_train).
absl::Status gather_sample_keys(ProcessGroup& g, const KvLayout& layout, uint64_t n_tokens, uint64_t shard_tokens,
                                uint64_t n, SampleKeyReader read, std::vector<float>* keys);

// The collective call around one layer's training on every rank: the call's
// summary (layer, length, index state, training settings; `before`: this
// rank's failure of the work that led here, an append's), then `train` (which
// gathers the sample and trains), then every rank's agreement, so that the
// layer changes on every rank or on none.
absl::Status group_train(ProcessGroup& g, uint32_t layer_index, const LayerStore& layer,
                         const ssa_session_config& cfg, const absl::Status& before,
                         absl::FunctionRef<absl::Status()> train);

}  // namespace ssa
