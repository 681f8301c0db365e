// The PQ index of one layer: training codebooks from the layer's keys, encoding
// keys into codes, and the policy deciding when to (re)train.
#pragma once

#include <stdint.h>

#include <vector>

#include "absl/status/statusor.h"
#include "cpu/thread_pool.h"
#include "index/kmeans.h"
#include "index/query_transform.h"
#include "index/score_aware.h"
#include "ssa.h"
#include "store/held_range.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "store/page_pool.h"

namespace ssa {

// Trains codebooks for every KV head of `layer` (k-means++ then Lloyd per
// subspace) on up to `sample` keys per head, spread evenly over the layer.
// The rotated proxies (SSA_PROXY_OPQ, _OPQ4) also learn each head's rotation
// (docs/ALGORITHM.md, section 4): from a variance-balanced PCA, kOpqRounds rounds
// of k-means on the rotated keys alternating with a Procrustes fit of the
// rotation to their reconstructions; the codebooks returned are those of the
// last rotation. The query-aware proxies (SSA_PROXY_QPQ, _QPQ4) learn each
// head's key and query transforms from the layer's observed queries
// (query_transform.h) and keep those moments with the codebooks. A
// parallel_weight above 1 then refines the codebooks for the score-aware loss
// (score_aware.h). The layout's code_bits must be the proxy's.
absl::StatusOr<CodebooksRef> train_codebooks(const KvLayout& layout, const LayerStore& layer,
                                             uint32_t sample, uint32_t iterations, ssa_proxy proxy,
                                             float parallel_weight, ThreadPool& pool);
inline constexpr uint32_t kOpqRounds = 4;

// The sample train_codebooks takes: n = min(n_tokens, sample) keys per head,
// key i that of token sample_token(i) (increasing in i), so that a group of
// processes whose ranks hold parts of the layer gathers exactly these keys.
inline uint64_t sample_count(uint64_t n_tokens, uint32_t sample) { return n_tokens < sample ? n_tokens : sample; }
// n_tokens < 2^32 and i < n <= 2^32: the product fits.
inline uint64_t sample_token(uint64_t i, uint64_t n_tokens, uint64_t n) { return i * n_tokens / n; }
// The first i whose sample_token is >= token (n when none is).
uint64_t first_sample_at(uint64_t token, uint64_t n_tokens, uint64_t n);
// Key i of head h as floats into keys[h][i - i0][d] for the sample's i in
// [i0, i1), from the layer's pages (which must hold those tokens). keys has
// room for [n_kv_heads][i1 - i0][head_dim].
void read_sample_keys(const KvLayout& layout, const LayerStore& layer, uint64_t n, uint64_t i0, uint64_t i1,
                      ThreadPool& pool, float* keys);
// Trains from the sampled keys x[h][n][d] (n >= 1) and, for the query-aware
// proxies, the layer's observed query moments (null: none), as train_codebooks does.
absl::StatusOr<CodebooksRef> train_codebooks_on(const KvLayout& layout, const std::vector<float>& keys,
                                                uint64_t n, uint32_t iterations, ssa_proxy proxy,
                                                float parallel_weight, const QueryMomentsRef& moments,
                                                ThreadPool& pool);

// The query-aware proxies' part of training from the sampled keys x[h][n][d]
// and the layer's observed query moments (null: none): each head's key and query
// transforms and the moments, into *books; and the training keys' weights
// [h][n] (key_weights.h), left empty when no recent query was observed (every
// key then weighs 1). The CUDA backend takes these from here and runs the
// k-means on the device.
absl::Status learn_query_aware(const KvLayout& layout, const std::vector<float>& keys, uint64_t n,
                               const QueryMomentsRef& moments, ThreadPool& pool, PqCodebooks* books,
                               std::vector<float>* weights);
// Its parts that both backends run on the host: checking that the moments fit
// the layer, sizing *books' transforms and keeping the moments there, with each
// head's whitening (begin); each head's T and Q from the whitened keys' second
// moments ([n_kv][d][d], the upper triangles read; finish); and the number of
// recent queries each head's key weights come from (empty when no head kept
// one: every key then weighs 1).
absl::StatusOr<std::vector<QueryWhitening>> begin_query_aware(const KvLayout& layout, const QueryMomentsRef& moments,
                                                               ThreadPool& pool, PqCodebooks* books);
void finish_query_aware(const KvLayout& layout, const std::vector<QueryWhitening>& whitening,
                        const std::vector<double>& second, ThreadPool& pool, PqCodebooks* books);
std::vector<uint32_t> weighting_query_counts(const KvLayout& layout, const QueryMoments* qm);

// The nearest-centroid searches of every codebook of one layer, built once per
// codebooks: building them (a transposed copy and the norms of every centroid)
// cost more than encoding the token of a one-token append.
// Codes are the nearest centroids per subspace, then (parallel_weight above 1)
// improved for the score-aware loss by ScoreAwareSearch::assign; 8-bit or
// packed 4-bit as the layout says.
class PqEncoder {
 public:
  PqEncoder(const KvLayout& layout, CodebooksRef books, float parallel_weight);
  const PqCodebooks* books() const { return books_.get(); }
  // Encodes keys of tokens [begin, end) of `kv_pages` into the (writable) pages
  // of `code_pages`, which must cover those tokens.
  void encode(const std::vector<PageRef>& kv_pages, std::vector<PageRef>& code_pages, uint64_t begin,
              uint64_t end, ThreadPool& pool) const;

 private:
  KvLayout layout_;
  CodebooksRef books_;
  std::vector<CentroidSearch> searches_;  // [n_kv_heads][subspaces]
  std::vector<ScoreAwareSearch> score_aware_;  // [n_kv_heads], empty for squared error
};

// q' = R q (OPQ) or T^-T q (QPQ) for a transformed codebook set's head (d floats
// each); q itself otherwise.
const float* rotate_query(const PqCodebooks& books, uint32_t head, const float* q, float* scratch);

// Builds a full set of fresh code pages for all tokens of `layer` with `books`:
// a code page for every KV page held (`held`), none (null) for the others.
absl::StatusOr<std::vector<PageRef>> encode_layer(const KvLayout& layout, const CodebooksRef& books,
                                                  float parallel_weight, const LayerStore& layer,
                                                  PagePool& code_pool, ThreadPool& pool,
                                                  const HeldRange& held = HeldRange{});

// The automatic policy: train once the layer holds index_min_tokens tokens, and
// again when it has grown by index_regrow_factor since the last training.
bool index_wants_training(const ssa_session_config& cfg, const LayerStore& layer,
                          uint64_t new_length);

}  // namespace ssa
