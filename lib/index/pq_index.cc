#include "pq_index.h"

#include <algorithm>
#include <memory>

#include "common/dtype.h"
#include "cpu/simd.h"
#include "key_weights.h"
#include "kmeans.h"
#include "kmeans_rng.h"
#include "proxy_kind.h"
#include "query_transform.h"
#include "rotation.h"
#include "score_aware.h"
#include "status.h"

namespace ssa {
namespace {

const uint8_t* key_row(const KvLayout& layout, const std::vector<PageRef>& pages, uint32_t head,
                       uint64_t token) {
  const Page& page = *pages[token / layout.page_tokens];
  return page.data() + layout.k_offset(head, static_cast<uint32_t>(token % layout.page_tokens));
}

}  // namespace

namespace {

// y = M x for a row-major d x d M (a key's rotation or transform, a query's
// transform), as eight interleaved partial sums per row, then added pairwise in
// a fixed order. A serial sum per row is bound by the adder's latency: at d 256
// it made a query-aware index's build 14x PQ's at 1M tokens (every key is
// transformed), and a query's transform cost as much as scoring 16K tokens with
// 4-bit codes. Same bits on every CPU (no fused multiply-adds).
void rotate(const float* m, const float* x, uint32_t d, float* y) {
  const uint32_t d8 = d / 8 * 8;
  for (uint32_t i = 0; i < d; ++i) {
    const float* mi = m + size_t{i} * d;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t j = 0; j < d8; j += 8)
      for (uint32_t k = 0; k < 8; ++k) acc[k] += mi[j + k] * x[j + k];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (uint32_t j = d8; j < d; ++j) s += mi[j] * x[j];
    y[i] = s;
  }
}

// Copies the n keys x[n][d] of head h, rotated by r when it is not null, into
// the subspace-major points[h][m][n][dsub] that k-means reads.
void scatter_points(const float* x, uint64_t n, const float* r, uint32_t h, uint32_t d, uint32_t M,
                    float* points) {
  const uint32_t dsub = d / M;
  std::vector<float> row(d);
  for (uint64_t i = 0; i < n; ++i) {
    const float* src = x + i * d;
    if (r != nullptr) {
      rotate(r, src, d, row.data());
      src = row.data();
    }
    for (uint32_t m = 0; m < M; ++m) {
      std::copy(src + m * dsub, src + (m + 1) * dsub, points + ((size_t{h} * M + m) * n + i) * dsub);
    }
  }
}

// The Procrustes step of OPQ for head h: the rotation that best maps its keys
// onto the reconstructions of their rotated selves by the current codebooks.
std::vector<double> refit_rotation(const float* x, uint64_t n, const float* r, const PqCodebooks& books,
                                   uint32_t h) {
  const uint32_t d = books.head_dim(), M = books.subspaces, dsub = books.sub_dim;
  std::vector<CentroidSearch> searches;
  searches.reserve(M);
  for (uint32_t m = 0; m < M; ++m) searches.emplace_back(books.centroid(h, m, 0), books.centroids, dsub);
  std::vector<double> cross(size_t{d} * d, 0.0);  // sum_t y_t x_t^T
  std::vector<float> z(d), y(d);
  for (uint64_t t = 0; t < n; ++t) {
    const float* xt = x + t * d;
    rotate(r, xt, d, z.data());
    for (uint32_t m = 0; m < M; ++m) {
      const float* c = books.centroid(h, m, searches[m].nearest(z.data() + m * dsub));
      std::copy(c, c + dsub, y.begin() + m * dsub);
    }
    for (uint32_t i = 0; i < d; ++i) {
      double* row = cross.data() + size_t{i} * d;
      const double yi = y[i];
      for (uint32_t j = 0; j < d; ++j) row[j] += yi * xt[j];
    }
  }
  return procrustes(cross, d);
}

void store_rotation(const std::vector<double>& r, float* out) {
  for (size_t i = 0; i < r.size(); ++i) out[i] = static_cast<float>(r[i]);
}

}  // namespace

uint64_t first_sample_at(uint64_t token, uint64_t n_tokens, uint64_t n) {
  // sample_token is increasing in i: a binary search.
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (sample_token(mid, n_tokens, n) >= token) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

void read_sample_keys(const KvLayout& layout, const LayerStore& layer, uint64_t n, uint64_t i0, uint64_t i1,
                      ThreadPool& pool, float* keys) {
  const uint32_t d = layout.head_dim;
  const uint64_t count = i1 - i0;
  const auto& kern = simd::kernels();
  pool.parallel_for(layout.n_kv_heads, [&](size_t h) {
    for (uint64_t i = i0; i < i1; ++i) {
      const uint64_t token = sample_token(i, layer.n_tokens, n);  // evenly spread, deterministic
      kern.to_f32(layout.dtype, key_row(layout, layer.kv_pages, static_cast<uint32_t>(h), token),
                  keys + (h * count + (i - i0)) * d, d);
    }
  });
}

absl::StatusOr<CodebooksRef> train_codebooks(const KvLayout& layout, const LayerStore& layer,
                                             uint32_t sample, uint32_t iterations, ssa_proxy proxy,
                                             float parallel_weight, ThreadPool& pool) {
  if (layer.n_tokens == 0) return invalid_argument("cannot train a PQ index on an empty layer");
  const uint64_t n = sample_count(layer.n_tokens, sample);
  // The sampled keys of each head as floats, x[h][n][d].
  std::vector<float> keys(size_t{layout.n_kv_heads} * n * layout.head_dim);
  read_sample_keys(layout, layer, n, 0, n, pool, keys.data());
  return train_codebooks_on(layout, keys, n, iterations, proxy, parallel_weight, layer.query_moments, pool);
}

namespace {

// Keys per task of learn_query_aware's steps per key; rows of a second-moment
// matrix per task; queries per threshold task. A layer's few heads would
// otherwise keep only as many threads busy (each task's bits do not depend on
// the split).
constexpr size_t kKeysPerTask = 1024;
constexpr uint32_t kRowsPerTask = 8;
constexpr uint32_t kQueriesPerTask = 16;

// Runs fn(h, lo, hi) over [0, count) in blocks of `per` for every head, as one
// parallel loop.
template <typename F>
void for_head_blocks(ThreadPool& pool, uint32_t heads, size_t count, size_t per, F&& fn) {
  const size_t blocks = (count + per - 1) / per;
  pool.parallel_for(heads * blocks, [&](size_t task) {
    const size_t lo = task % blocks * per;
    fn(static_cast<uint32_t>(task / blocks), lo, std::min(count, lo + per));
  });
}

}  // namespace

absl::StatusOr<std::vector<QueryWhitening>> begin_query_aware(const KvLayout& layout, const QueryMomentsRef& moments,
                                                               ThreadPool& pool, PqCodebooks* books) {
  const uint32_t d = layout.head_dim, H = layout.n_kv_heads;
  const QueryMoments* qm = moments.get();
  if (qm != nullptr && (qm->n_kv_heads != H || qm->head_dim != d)) {
    return invalid_argument("query moments of ", qm->n_kv_heads, " heads x ", qm->head_dim,
                            " dimensions do not fit the layer");
  }
  books->rotation.resize(size_t{H} * d * d);
  books->query_transform.resize(size_t{H} * d * d);
  books->trained_moments = moments;
  std::vector<QueryWhitening> whitening(H);
  pool.parallel_for(H, [&](size_t h) {
    const uint32_t kv = static_cast<uint32_t>(h);
    whitening[h] = query_whitening(qm != nullptr ? qm->sum_of(kv) : nullptr, qm != nullptr ? qm->count[kv] : 0, d);
  });
  return whitening;
}

void finish_query_aware(const KvLayout& layout, const std::vector<QueryWhitening>& whitening,
                        const std::vector<double>& second, ThreadPool& pool, PqCodebooks* books) {
  const uint32_t d = layout.head_dim, M = layout.pq_subspaces;
  const size_t dd = size_t{d} * d;
  pool.parallel_for(layout.n_kv_heads, [&](size_t h) {
    std::vector<double> c(second.begin() + h * dd, second.begin() + (h + 1) * dd);
    finish_query_transform(whitening[h], balanced_rotation_of(std::move(c), d, M), d, books->rotation.data() + h * dd,
                           books->query_transform.data() + h * dd);
  });
}

std::vector<uint32_t> weighting_query_counts(const KvLayout& layout, const QueryMoments* qm) {
  const uint32_t H = layout.n_kv_heads;
  if (qm == nullptr || qm->recent_count.size() != H) return {};
  std::vector<uint32_t> counts(H);
  bool any = false;
  for (uint32_t h = 0; h < H; ++h) {
    counts[h] = static_cast<uint32_t>(std::min<uint64_t>(qm->recent_count[h], kRecentQueries));
    any |= counts[h] > 0;
  }
  if (!any) counts.clear();
  return counts;
}

absl::Status learn_query_aware(const KvLayout& layout, const std::vector<float>& keys, uint64_t n,
                               const QueryMomentsRef& moments, ThreadPool& pool, PqCodebooks* books,
                               std::vector<float>* weights) {
  const uint32_t d = layout.head_dim, H = layout.n_kv_heads;
  const QueryMoments* qm = moments.get();
  // query_aware_transform, step by step over every head at once: the
  // whitening per head, the whitened keys and their second moments in blocks,
  // then each head's rotation and transforms.
  absl::StatusOr<std::vector<QueryWhitening>> whitening = begin_query_aware(layout, moments, pool, books);
  if (!whitening.ok()) return whitening.status();
  auto head_keys = [&](uint32_t h) { return keys.data() + size_t{h} * n * d; };
  std::vector<float> y(size_t{H} * n * d);
  for_head_blocks(pool, H, n, kKeysPerTask, [&](uint32_t h, size_t lo, size_t hi) {
    whiten_keys((*whitening)[h], head_keys(h), lo, hi, d, y.data() + size_t{h} * n * d);
  });
  std::vector<double> second(size_t{H} * d * d);
  for_head_blocks(pool, H, d, kRowsPerTask, [&](uint32_t h, size_t lo, size_t hi) {
    second_moment_rows(y.data() + size_t{h} * n * d, n, d, static_cast<uint32_t>(lo), static_cast<uint32_t>(hi),
                       second.data() + size_t{h} * d * d);
  });
  finish_query_aware(layout, *whitening, second, pool, books);
  // Each training key weighs by how often the layer's recent queries rank it
  // high (key_weights.h); without recent queries every key weighs 1.
  weights->clear();
  const std::vector<uint32_t> counts = weighting_query_counts(layout, qm);
  if (counts.empty()) return absl::OkStatus();
  weights->assign(size_t{H} * n, 1.0f);
  // heavy_key_weights, step by step: the scores of every head's keys, each
  // query's threshold, then the weights (heads without recent queries keep 1).
  std::vector<std::vector<float>> qt(H), scores(H), thresholds(H);
  for (uint32_t h = 0; h < H; ++h) {
    if (counts[h] == 0) continue;
    qt[h] = transposed_queries(qm->recent_of(h), counts[h], d);
    scores[h].resize(n * counts[h]);
    thresholds[h].resize(counts[h]);
  }
  const uint32_t most_recent = *std::max_element(counts.begin(), counts.end());
  for_head_blocks(pool, H, n, kKeysPerTask, [&](uint32_t h, size_t lo, size_t hi) {
    if (counts[h] > 0) key_query_scores(head_keys(h), lo, hi, d, qt[h].data(), counts[h], scores[h].data());
  });
  for_head_blocks(pool, H, most_recent, kQueriesPerTask, [&](uint32_t h, size_t lo, size_t hi) {
    std::vector<float> column;
    for (size_t j = lo; j < std::min<size_t>(hi, counts[h]); ++j)
      thresholds[h][j] = heavy_threshold(scores[h].data(), n, counts[h], static_cast<uint32_t>(j), column);
  });
  for_head_blocks(pool, H, n, kKeysPerTask, [&](uint32_t h, size_t lo, size_t hi) {
    if (counts[h] > 0)
      weights_from_thresholds(scores[h].data(), lo, hi, counts[h], thresholds[h].data(), weights->data() + h * n);
  });
  return absl::OkStatus();
}

absl::StatusOr<CodebooksRef> train_codebooks_on(const KvLayout& layout, const std::vector<float>& keys,
                                                uint64_t n, uint32_t iterations, ssa_proxy proxy,
                                                float parallel_weight, const QueryMomentsRef& moments,
                                                ThreadPool& pool) {
  if (n == 0) return invalid_argument("cannot train a PQ index on an empty layer");
  if (!proxy_is_known(proxy)) return invalid_argument("unknown proxy ", static_cast<int>(proxy));
  if (proxy_has_4bit_codes(proxy) != (layout.code_bits == 4) ||
      layout.pq_centroids > (layout.code_bits == 4 ? 16u : 256u)) {
    return invalid_argument("proxy ", static_cast<int>(proxy), " does not fit codes of ", layout.code_bits,
                            " bits and ", layout.pq_centroids, " centroids");
  }
  const uint32_t M = layout.pq_subspaces, K = layout.pq_centroids, dsub = layout.sub_dim();
  const uint32_t d = layout.head_dim, H = layout.n_kv_heads;
  if (keys.size() != size_t{H} * n * d) {
    return internal_error("training keys hold ", keys.size(), " floats for ", n, " keys of ", H, " heads");
  }

  auto books = std::make_shared<PqCodebooks>();
  books->n_kv_heads = H;
  books->subspaces = M;
  books->centroids = K;
  books->sub_dim = dsub;
  books->data.resize(size_t{H} * M * K * dsub);

  const bool opq = proxy_has_rotation(proxy), transformed = proxy_has_transform(proxy);
  std::vector<float> weights;  // empty: every key weighs 1
  if (opq) {
    books->rotation.resize(size_t{H} * d * d);
    pool.parallel_for(H, [&](size_t h) {
      store_rotation(balanced_pca_rotation(keys.data() + h * n * d, n, d, M),
                     books->rotation.data() + h * d * d);
    });
  } else if (proxy_is_query_aware(proxy)) {
    SSA_RETURN_IF_ERROR(learn_query_aware(layout, keys, n, moments, pool, books.get(), &weights));
  }
  const bool weighted = !weights.empty();
  // Subspace-major, so every (head, subspace) k-means reads one contiguous
  // [n][dsub] array.
  std::vector<float> points(size_t{H} * M * n * dsub);
  const uint32_t rounds = opq ? kOpqRounds : 1;
  for (uint32_t round = 0; round < rounds; ++round) {
    pool.parallel_for(H, [&](size_t h) {
      scatter_points(keys.data() + h * n * d, n,
                     transformed ? books->rotation_of(static_cast<uint32_t>(h)) : nullptr,
                     static_cast<uint32_t>(h), d, M, points.data());
    });
    pool.parallel_for(size_t{H} * M, [&](size_t hm) {
      const uint32_t h = static_cast<uint32_t>(hm / M), m = static_cast<uint32_t>(hm % M);
      kmeans_train(points.data() + hm * n * dsub, n, dsub, K, iterations, codebook_seed(h, m, M),
                   books->mutable_centroid(h, m, 0), weighted ? weights.data() + size_t{h} * n : nullptr);
    });
    if (round + 1 == rounds) break;
    pool.parallel_for(H, [&](size_t h) {
      float* r = books->rotation.data() + h * d * d;
      store_rotation(refit_rotation(keys.data() + h * n * d, n, r, *books, static_cast<uint32_t>(h)), r);
    });
  }
  // The score-aware loss refines the last k-means codebooks (of the transformed keys).
  if (is_score_aware(parallel_weight)) {
    pool.parallel_for(H, [&](size_t h) {
      const float* x = keys.data() + h * n * d;
      std::vector<float> rotated;
      if (transformed) {
        rotated.resize(size_t{n} * d);
        const float* r = books->rotation_of(static_cast<uint32_t>(h));
        for (uint64_t i = 0; i < n; ++i) rotate(r, x + i * d, d, rotated.data() + i * d);
        x = rotated.data();
      }
      score_aware_refine(x, n, M, K, dsub, parallel_weight, books->mutable_centroid(static_cast<uint32_t>(h), 0, 0));
    });
  }
  return CodebooksRef(std::move(books));
}

PqEncoder::PqEncoder(const KvLayout& layout, CodebooksRef books, float parallel_weight)
    : layout_(layout), books_(std::move(books)) {
  const uint32_t M = layout.pq_subspaces, dsub = layout.sub_dim();
  searches_.reserve(size_t{layout.n_kv_heads} * M);
  for (uint32_t h = 0; h < layout.n_kv_heads; ++h) {
    for (uint32_t m = 0; m < M; ++m) searches_.emplace_back(books_->centroid(h, m, 0), books_->centroids, dsub);
  }
  if (is_score_aware(parallel_weight)) {
    score_aware_.reserve(layout.n_kv_heads);
    for (uint32_t h = 0; h < layout.n_kv_heads; ++h)
      score_aware_.emplace_back(books_->centroid(h, 0, 0), M, books_->centroids, dsub, parallel_weight);
  }
}

void PqEncoder::encode(const std::vector<PageRef>& kv_pages, std::vector<PageRef>& code_pages, uint64_t begin,
                       uint64_t end, ThreadPool& pool) const {
  if (begin >= end) return;
  const KvLayout& layout = layout_;
  const uint32_t M = layout.pq_subspaces, dsub = layout.sub_dim(), d = layout.head_dim;
  const uint32_t P = layout.page_tokens;
  const uint64_t first_page = begin / P, last_page = (end - 1) / P;
  const auto& kern = simd::kernels();
  auto encode_page = [&](size_t i) {
    const uint64_t p = first_page + i;
    const uint64_t t0 = std::max<uint64_t>(begin, p * P), t1 = std::min<uint64_t>(end, (p + 1) * P);
    const Page& kv = *kv_pages[p];
    uint8_t* codes = code_pages[p]->mutable_data();
    std::vector<float> row(d), rotated(d);
    std::vector<uint32_t> code(M);
    for (uint32_t h = 0; h < layout.n_kv_heads; ++h) {
      for (uint64_t t = t0; t < t1; ++t) {
        const uint32_t slot = static_cast<uint32_t>(t - p * P);
        kern.to_f32(layout.dtype, kv.data() + layout.k_offset(h, slot), row.data(), d);
        const float* key = row.data();
        if (books_->rotated()) {
          rotate(books_->rotation_of(h), row.data(), d, rotated.data());
          key = rotated.data();
        }
        for (uint32_t m = 0; m < M; ++m) code[m] = searches_[size_t{h} * M + m].nearest(key + m * dsub);
        if (!score_aware_.empty()) score_aware_[h].assign(key, code.data());
        for (uint32_t m = 0; m < M; ++m) layout.set_code(codes, h, m, slot, code[m]);
      }
    }
  };
  // A single page (the usual small append) is encoded here, without a dispatch.
  if (first_page == last_page) {
    encode_page(0);
    return;
  }
  pool.parallel_for(last_page - first_page + 1, encode_page);
}

absl::StatusOr<std::vector<PageRef>> encode_layer(const KvLayout& layout, const CodebooksRef& books,
                                                  float parallel_weight, const LayerStore& layer,
                                                  PagePool& code_pool, ThreadPool& pool, const HeldRange& held) {
  std::vector<PageRef> pages;
  pages.reserve(layer.kv_pages.size());
  for (size_t i = 0; i < layer.kv_pages.size(); ++i) {
    if (!held.holds_page(i, layout.page_tokens)) {
      pages.emplace_back();
      continue;
    }
    absl::StatusOr<PageRef> page = code_pool.allocate();
    if (!page.ok()) return page.status();
    pages.push_back(*std::move(page));
  }
  if (held.lo(0) < held.hi(layer.n_tokens)) {
    PqEncoder(layout, books, parallel_weight).encode(layer.kv_pages, pages, held.lo(0), held.hi(layer.n_tokens), pool);
  }
  return pages;
}

const float* rotate_query(const PqCodebooks& books, uint32_t head, const float* q, float* scratch) {
  if (!books.rotated()) return q;
  rotate(books.query_transform_of(head), q, books.head_dim(), scratch);
  return scratch;
}

bool index_wants_training(const ssa_session_config& cfg, const LayerStore& layer,
                          uint64_t new_length) {
  if (layer.codebooks == nullptr) return new_length >= cfg.index_min_tokens;
  if (cfg.index_regrow_factor <= 0.0f) return false;
  return static_cast<double>(new_length) >=
         static_cast<double>(cfg.index_regrow_factor) * static_cast<double>(layer.trained_at_tokens);
}

}  // namespace ssa
