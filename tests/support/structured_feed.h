// One structured context (8 query heads, 2 KV heads, head dim 64) encoded once in
// a dtype and appended to several sessions in the same chunks, so that sessions
// built differently (sharded, ranks of a group, unsharded) hold the same rows and
// can be compared bitwise; and the session config those tests use, whose PQ index
// trains quickly (16 centroids, 64-token pages, an index from 4096 tokens trained
// on 2048 of them in 3 iterations) so that contexts of a few shards are indexed.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <vector>

#include "config.h"
#include "handles.h"
#include "session_helpers.h"
#include "ssa.h"
#include "structured_context.h"

namespace ssa_test {

constexpr uint32_t kFeedQHeads = 8, kFeedKvHeads = 2, kFeedHeadDim = 64;

inline ssa_session_config quick_index_config(uint32_t n_layers, ssa_dtype t) {
  ssa_session_config c = make_config(n_layers, kFeedQHeads, kFeedKvHeads, kFeedHeadDim, t);
  c.pq_centroids = 16;
  c.page_tokens = 64;
  c.index_min_tokens = 4096;
  c.index_train_sample = 2048;
  c.index_iterations = 3;
  return c;
}

struct StructuredFeed {
  StructuredContext ctx;
  ssa_dtype t;
  std::vector<uint8_t> k, v, q;  // ctx.K, ctx.V and ctx.q encoded in t

  StructuredFeed(size_t n, ssa_dtype dt, uint64_t seed) : t(dt) {
    StructuredOptions o;
    o.seed = seed;
    ctx = make_structured_context(n, kFeedKvHeads, kFeedQHeads, kFeedHeadDim, o);
    k = encode(ctx.K, t);
    v = encode(ctx.V, t);
    q = encode(ctx.q, t);
  }

  // Tokens [t0, t1) of the context into layer `layer` of each session.
  void append(std::initializer_list<ssa_session*> ss, uint32_t layer, size_t t0, size_t t1) const {
    append(std::vector<ssa_session*>(ss), layer, t0, t1);
  }
  void append(const std::vector<ssa_session*>& ss, uint32_t layer, size_t t0, size_t t1) const {
    const size_t row = size_t{kFeedKvHeads} * kFeedHeadDim * (t == SSA_DTYPE_F32 ? 4 : 2);
    for (ssa_session* s : ss) {
      SSA_CHECK_OK(ssa_session_append(s, layer, k.data() + t0 * row, v.data() + t0 * row, t1 - t0));
    }
  }
};

// Every count of two decodes' statistics equal, and the residual mass bit for bit.
inline bool same_stats(const ssa_decode_stats& a, const ssa_decode_stats& b) {
  return a.context_tokens == b.context_tokens && a.tokens_read == b.tokens_read &&
         a.heavy_tokens == b.heavy_tokens && a.draws == b.draws && a.unique_samples == b.unique_samples &&
         memcmp(&a.residual_proxy_mass, &b.residual_proxy_mass, sizeof(double)) == 0 &&
         a.scored_tokens == b.scored_tokens && a.window_only_heads == b.window_only_heads;
}

}  // namespace ssa_test
