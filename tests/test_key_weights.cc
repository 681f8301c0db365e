// The query-aware proxies' key weights (lib/index/key_weights.h): the weights
// against an independent integer reference, k-means under weights (unit weights
// change nothing; the trained centroids are weighted means of their clusters),
// the window of recent queries a layer keeps, and what the weights buy on queries
// that read a few keys (their top keys scored closer) against the same layer
// trained without them.
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
#include <functional>
#include <random>
#include <shared_mutex>
#include <tuple>
#include <vector>

#include "decode/candidate_scores.h"
#include "index/key_weights.h"
#include "index/kmeans.h"
#include "index/pq_index.h"
#include "index/query_transform.h"
#include "runtime.h"
#include "session.h"
#include "support/session_helpers.h"

using namespace ssa_test;

TEST_CASE("heavy_key_weights: 1 + boost x the share of queries whose top 5% holds the key, ties included") {
  std::mt19937_64 rng(81);
  for (const auto& [n, d, m] : {std::tuple<size_t, uint32_t, uint32_t>{1, 4, 1}, {19, 3, 2}, {20, 8, 7}, {1000, 16, 33},
                                {4097, 5, 256}}) {
    CAPTURE(n);
    CAPTURE(m);
    // Small integers: every float score is exact, and many tie.
    std::uniform_int_distribution<int> small(-3, 3);
    std::vector<float> x(n * d), q(size_t{m} * d);
    for (float& v : x) v = static_cast<float>(small(rng));
    for (float& v : q) v = static_cast<float>(small(rng));
    std::vector<float> w(n);
    ssa::heavy_key_weights(x.data(), n, d, q.data(), m, w.data());
    const size_t top = std::max<size_t>(1, static_cast<size_t>(ceil(0.05 * double(n))));
    std::vector<uint32_t> hits(n, 0);
    for (uint32_t j = 0; j < m; ++j) {
      std::vector<int64_t> s(n);
      for (size_t i = 0; i < n; ++i) {
        int64_t acc = 0;
        for (uint32_t k = 0; k < d; ++k) acc += int64_t(x[i * d + k]) * int64_t(q[size_t{j} * d + k]);
        s[i] = acc;
      }
      std::vector<int64_t> sorted = s;
      std::sort(sorted.begin(), sorted.end(), std::greater<int64_t>());
      for (size_t i = 0; i < n; ++i) hits[i] += s[i] >= sorted[top - 1] ? 1 : 0;
    }
    size_t heavy = 0;
    for (size_t i = 0; i < n; ++i) {
      CHECK(w[i] == 1.0f + ssa::kHeavyKeyBoost * float(hits[i]) / float(m));
      heavy += hits[i] > 0;
    }
    CHECK(heavy >= top);
  }
}

namespace {

// Points in 2-d clusters, and weights: 1, with every 7th point of the first half heavy.
struct Weighted {
  std::vector<float> points, weights;
};
Weighted weighted_points(size_t n, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  Weighted w;
  w.points.resize(n * dim);
  w.weights.assign(n, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const float cx = float(i % 5) * 3.0f;
    for (uint32_t j = 0; j < dim; ++j) w.points[i * dim + j] = nd(rng) + (j == 0 ? cx : 0.0f);
    if (i < n / 2 && i % 7 == 0) w.weights[i] = 1.0f + 200.0f * float(i % 3) / 2.0f;
  }
  return w;
}

}  // namespace

TEST_CASE("weighted k-means: unit weights change nothing; each centroid is the weighted mean of its cluster") {
  const uint32_t dim = 2, k = 16;
  for (size_t n : {size_t{600}, size_t{5000}}) {  // below and above the seeding subset's 4096 points
    CAPTURE(n);
    const Weighted w = weighted_points(n, dim, 82 + n);
    const std::vector<float> ones(n, 1.0f);
    std::vector<float> plain(k * dim), unit(k * dim), heavy(k * dim);
    ssa::kmeans_train(w.points.data(), n, dim, k, 40, 7, plain.data());
    ssa::kmeans_train(w.points.data(), n, dim, k, 40, 7, unit.data(), ones.data());
    CHECK(plain == unit);
    ssa::kmeans_train(w.points.data(), n, dim, k, 40, 7, heavy.data(), w.weights.data());
    CHECK(heavy != plain);
    // After 40 iterations Lloyd has converged on these points: a centroid is the
    // weighted mean of the points nearest to it (float centroids of double sums).
    const ssa::CentroidSearch search(heavy.data(), k, dim);
    std::vector<double> sum(k * dim, 0.0), mass(k, 0.0), unweighted(k * dim, 0.0);
    std::vector<uint32_t> count(k, 0);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t c = search.nearest(w.points.data() + i * dim);
      for (uint32_t j = 0; j < dim; ++j) {
        sum[c * dim + j] += double(w.weights[i]) * w.points[i * dim + j];
        unweighted[c * dim + j] += w.points[i * dim + j];
      }
      mass[c] += w.weights[i];
      ++count[c];
    }
    double apart = 0.0;  // how far the plain means are: the check below can tell them apart
    for (uint32_t c = 0; c < k; ++c) {
      REQUIRE(count[c] > 0);
      for (uint32_t j = 0; j < dim; ++j) {
        CHECK(fabs(heavy[c * dim + j] - sum[c * dim + j] / mass[c]) < 1e-4);
        apart = std::max(apart, fabs(heavy[c * dim + j] - unweighted[c * dim + j] / count[c]));
      }
    }
    CHECK(apart > 0.05);
    // And the weighted loss is lower than the unweighted codebook's.
    auto weighted_loss = [&](const std::vector<float>& books) {
      const ssa::CentroidSearch s(books.data(), k, dim);
      double e = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const float* x = w.points.data() + i * dim;
        const float* c = books.data() + size_t{s.nearest(x)} * dim;
        for (uint32_t j = 0; j < dim; ++j) e += double(w.weights[i]) * (x[j] - c[j]) * (x[j] - c[j]);
      }
      return e;
    };
    MESSAGE("weighted loss: unweighted k-means " << weighted_loss(plain) << ", weighted " << weighted_loss(heavy));
    CHECK(weighted_loss(heavy) < weighted_loss(plain));
  }
}

TEST_CASE("add_query_moments keeps each KV head's last 256 queries, oldest first, over any number of calls") {
  std::mt19937_64 rng(83);
  std::normal_distribution<float> nd;
  const uint32_t n_kv = 2, n_q = 6, d = 5, g = 3;
  std::vector<float> q(size_t{150} * n_q * d);
  for (float& x : q) x = nd(rng);
  for (const std::vector<uint32_t>& calls : {std::vector<uint32_t>{1}, {20, 50}, {40, 2, 1}, {100, 50}, {150}, {86, 1}}) {
    CAPTURE(calls.size());
    CAPTURE(calls[0]);
    std::shared_ptr<ssa::QueryMoments> m;
    uint32_t done = 0;
    for (uint32_t c : calls) {
      m = ssa::add_query_moments(m.get(), n_kv, n_q, d, q.data() + size_t{done} * n_q * d, c);
      done += c;
    }
    for (uint32_t h = 0; h < n_kv; ++h) {
      // Every query of this KV head in observation order; the last 256 are kept.
      std::vector<float> all;
      for (uint32_t t = 0; t < done; ++t)
        for (uint32_t j = 0; j < g; ++j) {
          const float* x = q.data() + (size_t{t} * n_q + h * g + j) * d;
          all.insert(all.end(), x, x + d);
        }
      const size_t want = std::min<size_t>(all.size() / d, ssa::kRecentQueries);
      REQUIRE(m->recent_count[h] == want);
      CHECK(std::equal(all.end() - want * d, all.end(), m->recent_of(h)));
      CHECK(std::all_of(m->recent_of(h) + want * d, m->recent_of(h) + size_t{ssa::kRecentQueries} * d,
                        [](float v) { return v == 0.0f; }));
    }
  }
}

namespace {

// Keys with a few rare spikes (the keys the queries will rank top), queries
// that read those spike directions.
struct Spiky {
  std::vector<float> k, v, q_seen, q_test;
};
Spiky spiky(uint32_t n, uint32_t d, uint32_t n_q, uint32_t seen, uint32_t test, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  Spiky w;
  w.k.resize(size_t{n} * d);
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t j = 0; j < d; ++j) w.k[t * d + j] = nd(rng);
    if (t % 23 == 0) w.k[t * d + t % 4] += 4.0f + nd(rng);  // 1 in 23 keys stands out along one of 4 axes
  }
  w.v.resize(w.k.size());
  for (float& x : w.v) x = nd(rng);
  auto query = [&](std::vector<float>& out, uint32_t count) {
    out.resize(size_t{count} * n_q * d);
    for (size_t i = 0; i < out.size(); i += d) {
      for (uint32_t j = 0; j < d; ++j) out[i + j] = 0.3f * nd(rng);
      out[i + (i / d) % 4] += 3.0f;
    }
  };
  query(w.q_seen, seen);
  query(w.q_test, test);
  return w;
}

}  // namespace

TEST_CASE("a query-aware index trained with its recent queries scores their top keys closer than one without") {
  auto rt = make_runtime(2);
  const uint32_t d = 32, n_q = 2, n = 6000;
  const Spiky w = spiky(n, d, n_q, 64, 16, 84);
  for (ssa_proxy proxy : {SSA_PROXY_QPQ, SSA_PROXY_QPQ4}) {
    CAPTURE(proxy);
    ssa_session_config c = make_config(1, n_q, 1, d, SSA_DTYPE_F32);
    const bool four = proxy == SSA_PROXY_QPQ4;
    c.pq_subspaces = four ? 16 : 8;
    c.pq_centroids = four ? 16 : 256;
    c.index_min_tokens = n;
    c.index_train_sample = n;
    c.index_iterations = 8;
    c.proxy = proxy;
    SessionPtr s = make_session(rt.get(), c);
    SSA_CHECK_OK(ssa_session_observe_queries(s.get(), 0, w.q_seen.data(), 64));
    append_f32(s.get(), 0, w.k, w.v, n, SSA_DTYPE_F32);
    std::shared_lock lock(s->mu);
    const ssa::LayerStore& weighted = s->layers[0];
    REQUIRE(weighted.codebooks != nullptr);
    REQUIRE(weighted.query_moments->recent_count[0] == 64 * n_q);
    // The same layer trained from the same moments without the recent queries.
    ssa::LayerStore plain = weighted;
    auto moments = std::make_shared<ssa::QueryMoments>(*weighted.query_moments);
    moments->recent_count.assign(1, 0);
    std::fill(moments->recent.begin(), moments->recent.end(), 0.0f);
    plain.query_moments = moments;
    absl::StatusOr<ssa::CodebooksRef> books =
        ssa::train_codebooks(s->layout, plain, n, c.index_iterations, proxy, 1.0f, *s->rt->pool);
    REQUIRE(books.ok());
    absl::StatusOr<std::vector<ssa::PageRef>> codes =
        ssa::encode_layer(s->layout, *books, 1.0f, plain, *s->code_pool, *s->rt->pool, s->rt->held);
    REQUIRE(codes.ok());
    plain.codebooks = *books;
    plain.code_pages = *std::move(codes);
    CHECK(plain.codebooks->query_transform == weighted.codebooks->query_transform);  // the weights change only k-means
    std::vector<float> lut, exact(n), got(n);
    double recall[2] = {0, 0}, heavy_error[2] = {0, 0};
    for (uint32_t i = 0; i < 16 * n_q; ++i) {
      const float* q = w.q_test.data() + size_t{i} * d;
      ssa::score_tokens(s->layout, weighted, 0, q, SSA_METHOD_ORACLE_TOPK, 0, n, &lut, exact.data());
      std::vector<uint32_t> top(n);
      for (uint32_t t = 0; t < n; ++t) top[t] = t;
      const size_t k = n / 50;
      std::partial_sort(top.begin(), top.begin() + k, top.end(), [&](uint32_t a, uint32_t b) { return exact[a] > exact[b]; });
      for (int which = 0; which < 2; ++which) {
        ssa::score_tokens(s->layout, which == 0 ? plain : weighted, 0, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, got.data());
        std::vector<uint32_t> mine(n);
        for (uint32_t t = 0; t < n; ++t) mine[t] = t;
        std::partial_sort(mine.begin(), mine.begin() + k, mine.end(), [&](uint32_t a, uint32_t b) { return got[a] > got[b]; });
        std::vector<uint32_t> a(top.begin(), top.begin() + k), b(mine.begin(), mine.begin() + k), both;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
        recall[which] += double(both.size()) / double(k) / (16 * n_q);
        for (uint32_t t : a) heavy_error[which] += double(got[t] - exact[t]) * (got[t] - exact[t]);
      }
    }
    MESSAGE("top-2% recall without the recent queries " << recall[0] << ", with them " << recall[1]
                                                          << "; squared score error on the exact top 2% "
                                                          << heavy_error[0] << " and " << heavy_error[1]);
    // What the weights buy: the keys queries rank top are scored closer.
    CHECK(heavy_error[1] < 0.8 * heavy_error[0]);
  }
}

// learn_query_aware runs the transforms' and the weights' steps over every head
// at once, in blocks of keys, rows and queries: with any thread count its
// transforms and weights are, bit for bit, those of the single-pass functions
// (query_aware_transform, heavy_key_weights) per head. Three heads (one shown
// no recent query, whose keys all weigh 1), a sample that is no multiple of the
// blocks, 1, 2 and 5 threads.
TEST_CASE("learn_query_aware: every thread count gives the single-pass functions' bits, head by head") {
  const uint32_t H = 3, d = 32, M = 8, n_q = 6;
  const size_t n = 2500;
  std::mt19937_64 rng(515);
  std::normal_distribution<float> nd;
  std::vector<float> keys(size_t{H} * n * d);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = nd(rng) * (1.0f + 0.1f * static_cast<float>(i % d));
  std::vector<float> q(size_t{40} * n_q * d);
  for (float& x : q) x = nd(rng);
  auto moments = ssa::add_query_moments(nullptr, H, n_q, d, q.data(), 40);
  moments->recent_count[2] = 0;  // as a layer whose head 2 kept no recent query
  ssa::KvLayout L;
  L.n_layers = 1;
  L.n_q_heads = n_q;
  L.n_kv_heads = H;
  L.head_dim = d;
  L.pq_subspaces = M;
  ssa::QueryMomentsRef ref = moments;

  std::vector<float> t_ref(size_t{H} * d * d), q_ref(size_t{H} * d * d), w_ref(size_t{H} * n, 1.0f);
  for (uint32_t h = 0; h < H; ++h) {
    const float* x = keys.data() + size_t{h} * n * d;
    ssa::query_aware_transform(x, n, d, M, moments->sum_of(h), moments->count[h], t_ref.data() + size_t{h} * d * d,
                               q_ref.data() + size_t{h} * d * d);
    if (moments->recent_count[h] > 0)
      ssa::heavy_key_weights(x, n, d, moments->recent_of(h), static_cast<uint32_t>(moments->recent_count[h]),
                             w_ref.data() + size_t{h} * n);
  }
  // The weights are not all 1 where there were queries.
  CHECK(std::count(w_ref.begin(), w_ref.begin() + 2 * n, 1.0f) < static_cast<std::ptrdiff_t>(2 * n));
  for (const int threads : {1, 2, 5}) {
    CAPTURE(threads);
    ssa::ThreadPool pool(threads);
    ssa::PqCodebooks books;
    std::vector<float> w;
    REQUIRE(ssa::learn_query_aware(L, keys, n, ref, pool, &books, &w).ok());
    CHECK(books.rotation == t_ref);
    CHECK(books.query_transform == q_ref);
    CHECK(w == w_ref);
    CHECK(books.trained_moments == ref);
  }
}
