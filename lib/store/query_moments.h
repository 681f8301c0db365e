// The queries a layer has been shown (ssa_session_observe_queries), for the
// query-aware proxies (SSA_PROXY_QPQ, _QPQ4): per KV head the sum of q q^T over
// its query heads' queries (as given, before the 1/sqrt(d) scale) and their
// count, which shape the key transform (query_transform.h), and the most recent
// of those queries, which weight the training keys (key_weights.h). Immutable
// once built: an observation makes a new one, so forks and the codebooks trained
// from it share it safely.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

namespace ssa {

// Query heads' queries one KV head may have observed in all: far above any
// real session's, and low enough that counts never wrap.
inline constexpr uint64_t kMaxQueryCount = uint64_t{1} << 48;

// Recent queries kept per KV head: enough to tell which keys the layer's
// queries read (a prefill shows hundreds), few enough that a layer of 8 KV
// heads of 128 dimensions keeps 1 MiB.
inline constexpr uint32_t kRecentQueries = 256;

struct QueryMoments {
  uint32_t n_kv_heads = 0, head_dim = 0;
  std::vector<uint64_t> count;  // [n_kv_heads]
  std::vector<double> sum;      // [n_kv_heads][head_dim][head_dim], symmetric
  // Per KV head its last recent_count[h] <= min(count[h], kRecentQueries)
  // queries, oldest first, in observation order (step, then query head); the
  // rows after them are zero.
  std::vector<uint64_t> recent_count;  // [n_kv_heads]
  std::vector<float> recent;           // [n_kv_heads][kRecentQueries][head_dim]

  const double* sum_of(uint32_t head) const { return sum.data() + size_t{head} * head_dim * head_dim; }
  const float* recent_of(uint32_t head) const { return recent.data() + size_t{head} * kRecentQueries * head_dim; }
};

using QueryMomentsRef = std::shared_ptr<const QueryMoments>;

}  // namespace ssa
