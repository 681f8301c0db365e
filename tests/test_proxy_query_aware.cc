// The query-aware proxies (SSA_PROXY_QPQ, _QPQ4): the moments observed queries
// accumulate, against direct float64 sums; the learned transforms against their
// contract (T^T Q = I, |T r|^2 = r^T S r: the expected squared score error);
// sessions' codes and scores against float64 references built from their
// codebooks and transforms; the ranking gain on queries that use few directions;
// and observe_queries' refusals, which change nothing.
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
#include <random>
#include <shared_mutex>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "decode/candidate_scores.h"
#include "index/query_transform.h"
#include "index/rotation.h"
#include "session.h"
#include "support/pq_reference.h"
#include "support/session_helpers.h"

using namespace ssa_test;

namespace {

// Queries concentrated in `strong` random directions (standard deviation 3
// there, 0.3 elsewhere), keys spread over all directions with decaying scales:
// the directions the keys vary most in are not the ones the queries read.
struct Workload {
  uint32_t d, n_kv, n_q, n;
  std::vector<float> k, v, q_train, q_test;  // k, v: [n][n_kv][d]; q_*: [count][n_q][d]
};

Workload make_workload(uint32_t n, uint32_t n_kv, uint32_t n_q, uint32_t d, uint32_t strong, uint32_t n_train,
                       uint32_t n_test, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  Workload w{d, n_kv, n_q, n, {}, {}, {}, {}};
  std::vector<double> dirs(size_t{d} * d);  // rows: a random orthonormal basis
  for (double& x : dirs) x = nd(rng);
  for (uint32_t i = 0; i < d; ++i) {
    double* r = dirs.data() + size_t{i} * d;
    for (uint32_t j = 0; j < i; ++j) {
      const double* o = dirs.data() + size_t{j} * d;
      double c = 0.0;
      for (uint32_t k = 0; k < d; ++k) c += r[k] * o[k];
      for (uint32_t k = 0; k < d; ++k) r[k] -= c * o[k];
    }
    double nn = 0.0;
    for (uint32_t k = 0; k < d; ++k) nn += r[k] * r[k];
    for (uint32_t k = 0; k < d; ++k) r[k] /= sqrt(nn);
  }
  w.k.resize(size_t{n} * n_kv * d);
  for (size_t t = 0; t < size_t{n} * n_kv; ++t)
    for (uint32_t i = 0; i < d; ++i) w.k[t * d + i] = static_cast<float>(nd(rng) * 2.0 * exp(-0.03 * i));
  w.v.resize(w.k.size());
  for (float& x : w.v) x = static_cast<float>(nd(rng));
  auto query = [&](float* out) {
    std::vector<double> c(d);
    for (uint32_t i = 0; i < d; ++i) c[i] = nd(rng) * (i < strong ? 3.0 : 0.3);
    for (uint32_t j = 0; j < d; ++j) {
      double s = 0.0;
      for (uint32_t i = 0; i < d; ++i) s += c[i] * dirs[size_t{d - 1 - i} * d + j];  // the keys' weakest axes last
      out[j] = static_cast<float>(s);
    }
  };
  w.q_train.resize(size_t{n_train} * n_q * d);
  for (size_t i = 0; i < w.q_train.size(); i += d) query(w.q_train.data() + i);
  w.q_test.resize(size_t{n_test} * n_q * d);
  for (size_t i = 0; i < w.q_test.size(); i += d) query(w.q_test.data() + i);
  return w;
}

ssa_session_config qpq_config(const Workload& w, ssa_proxy proxy) {
  ssa_session_config c = make_config(1, w.n_q, w.n_kv, w.d, SSA_DTYPE_F32);
  const bool four = proxy == SSA_PROXY_PQ4 || proxy == SSA_PROXY_OPQ4 || proxy == SSA_PROXY_QPQ4;
  c.pq_subspaces = four ? 32 : 16;
  c.pq_centroids = 16;
  c.index_min_tokens = w.n;
  c.index_train_sample = w.n;
  c.index_iterations = 6;
  c.proxy = proxy;
  return c;
}

// A session of the workload's keys, shown its training queries first when the
// proxy learns from them (the index trains at the append of all n keys).
SessionPtr trained(ssa_runtime* rt, const Workload& w, ssa_proxy proxy) {
  SessionPtr s = make_session(rt, qpq_config(w, proxy));
  if (proxy == SSA_PROXY_QPQ || proxy == SSA_PROXY_QPQ4) {
    SSA_CHECK_OK(ssa_session_observe_queries(s.get(), 0, w.q_train.data(), w.q_train.size() / (w.n_q * w.d)));
  }
  append_f32(s.get(), 0, w.k, w.v, w.n, SSA_DTYPE_F32);
  return s;
}

double recall_at(const std::vector<float>& exact, const std::vector<float>& proxy, size_t k) {
  std::vector<uint32_t> a(exact.size()), b(exact.size());
  for (uint32_t i = 0; i < a.size(); ++i) a[i] = b[i] = i;
  std::partial_sort(a.begin(), a.begin() + k, a.end(), [&](uint32_t x, uint32_t y) { return exact[x] > exact[y]; });
  std::partial_sort(b.begin(), b.begin() + k, b.end(), [&](uint32_t x, uint32_t y) { return proxy[x] > proxy[y]; });
  std::sort(a.begin(), a.begin() + k);
  std::sort(b.begin(), b.begin() + k);
  std::vector<uint32_t> both;
  std::set_intersection(a.begin(), a.begin() + k, b.begin(), b.begin() + k, std::back_inserter(both));
  return double(both.size()) / double(k);
}

}  // namespace

TEST_CASE("add_query_moments: per KV head the sum of q q^T over its query heads, in any number of calls") {
  // Each element is the float64 sum of its exact products in the queries' order,
  // bit for bit, at head dims the tiled sums take (multiples of 8) and not, over
  // more queries than one block of rows.
  for (const uint32_t d : {8u, 12u, 40u, 128u}) {
    CAPTURE(d);
    std::mt19937_64 rng(71 + d);
    std::normal_distribution<float> nd;
    const uint32_t n_kv = 2, n_q = 6, n = 37;
    std::vector<float> q(size_t{n} * n_q * d);
    for (float& x : q) x = nd(rng) * (1.0f + static_cast<float>(rng() % 7));
    const auto once = ssa::add_query_moments(nullptr, n_kv, n_q, d, q.data(), n);
    const auto first = ssa::add_query_moments(nullptr, n_kv, n_q, d, q.data(), 20);
    const auto twice = ssa::add_query_moments(first.get(), n_kv, n_q, d, q.data() + size_t{20} * n_q * d, n - 20);
    size_t differ = 0, asymmetric = 0;
    for (uint32_t h = 0; h < n_kv; ++h) {
      CHECK(once->count[h] == uint64_t{n} * 3);
      CHECK(twice->count[h] == once->count[h]);
      for (uint32_t a = 0; a < d; ++a) {
        for (uint32_t b = 0; b < d; ++b) {
          double want = 0.0;
          for (uint32_t t = 0; t < n; ++t)
            for (uint32_t j = 0; j < 3; ++j) {
              const float* x = q.data() + (size_t{t} * n_q + h * 3 + j) * d;
              want += double{x[std::min(a, b)]} * x[std::max(a, b)];
            }
          differ += once->sum_of(h)[a * d + b] != want;
          differ += twice->sum_of(h)[a * d + b] != want;
          asymmetric += once->sum_of(h)[a * d + b] != once->sum_of(h)[b * d + a];
        }
      }
    }
    CHECK(differ == 0);
    CHECK(asymmetric == 0);
    CHECK(first->count[0] == 60);  // the input object is not changed
    // The KV heads summed in parallel: the same sums and windows.
    ssa::ThreadPool pool(3);
    const auto parallel = ssa::add_query_moments(first.get(), n_kv, n_q, d, q.data() + size_t{20} * n_q * d, n - 20,
                                                 &pool);
    CHECK(parallel->sum == twice->sum);
    CHECK(parallel->recent == twice->recent);
    CHECK(parallel->count == twice->count);
  }
}

TEST_CASE("query_aware_transform: T^T Q = I and |T r|^2 is the mean squared score error r^T S r") {
  const uint32_t d = 32, M = 8, n_q_samples = 4000;
  const Workload w = make_workload(1500, 1, 1, d, 6, n_q_samples, 1, 72);
  const auto moments = ssa::add_query_moments(nullptr, 1, 1, d, w.q_train.data(), n_q_samples);
  std::vector<float> t(size_t{d} * d), q(size_t{d} * d);
  ssa::query_aware_transform(w.k.data(), w.n, d, M, moments->sum_of(0), moments->count[0], t.data(), q.data());
  CHECK(ssa::inverse_transpose_error(t.data(), q.data(), d) < 1e-4);
  // S here is well conditioned (eigenvalues 0.09..9, ratio 100, within the floor's 1000):
  // for random r, |T r|^2 = r^T S r, S = the queries' mean q q^T.
  std::mt19937_64 rng(73);
  std::normal_distribution<double> nd;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> r(d);
    for (double& x : r) x = nd(rng);
    double tr2 = 0.0, srs = 0.0;
    for (uint32_t i = 0; i < d; ++i) {
      double y = 0.0;
      for (uint32_t j = 0; j < d; ++j) y += double{t[size_t{i} * d + j]} * r[j];
      tr2 += y * y;
      for (uint32_t j = 0; j < d; ++j) srs += r[i] * moments->sum_of(0)[size_t{i} * d + j] / n_q_samples * r[j];
    }
    CHECK(fabs(tr2 - srs) <= 1e-4 * srs);
  }
  // Without queries: T = Q, orthogonal (OPQ's starting rotation).
  ssa::query_aware_transform(w.k.data(), w.n, d, M, nullptr, 0, t.data(), q.data());
  CHECK(t == q);
  CHECK(ssa::orthogonality_error(t.data(), d) < 1e-5);
  // Damage is seen: a moved entry of Q, or a non-finite one.
  std::vector<float> bad = q;
  ssa::query_aware_transform(w.k.data(), w.n, d, M, moments->sum_of(0), moments->count[0], t.data(), q.data());
  bad = q;
  bad[5] += 0.05f;
  CHECK(ssa::inverse_transpose_error(t.data(), bad.data(), d) > ssa::kTransformTolerance);
  bad = q;
  bad[9] = NAN;
  CHECK(!(ssa::inverse_transpose_error(t.data(), bad.data(), d) <= ssa::kTransformTolerance));
}

TEST_CASE("a query-aware session quantises T k and scores Q q, within float rounding (8-bit) or the table bound (4-bit)") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 4, n = 1200;
  const Workload w = make_workload(n, n_kv, n_q, d, 8, 300, 2, 74);
  for (ssa_proxy proxy : {SSA_PROXY_QPQ, SSA_PROXY_QPQ4}) {
    CAPTURE(proxy);
    SessionPtr s = trained(rt.get(), w, proxy);
    std::shared_lock lock(s->mu);
    const ssa::KvLayout& L = s->layout;
    const ssa::LayerStore& layer = s->layers[0];
    REQUIRE(layer.codebooks != nullptr);
    const ssa::PqCodebooks& cb = *layer.codebooks;
    REQUIRE(cb.rotated());
    REQUIRE(!cb.query_transform.empty());
    CHECK(cb.trained_moments == layer.query_moments);
    REQUIRE(cb.trained_moments != nullptr);
    CHECK(cb.trained_moments->count[0] == 300 * 2);
    const uint32_t M = L.pq_subspaces, K = L.pq_centroids, sub = L.sub_dim();
    size_t worse = 0;
    for (uint32_t h = 0; h < n_kv; ++h) {
      CHECK(ssa::inverse_transpose_error(cb.rotation_of(h), cb.query_transform_of(h), d) < 1e-4);
      for (uint32_t t = 0; t < n; t += 7) {
        std::vector<double> z(d, 0.0);
        for (uint32_t i = 0; i < d; ++i)
          for (uint32_t j = 0; j < d; ++j)
            z[i] += double{cb.rotation_of(h)[size_t{i} * d + j]} * w.k[(size_t{t} * n_kv + h) * d + j];
        for (uint32_t m = 0; m < M; ++m) {
          const uint32_t code = L.code_at(layer.code_pages[t / L.page_tokens]->data(), h, m, t % L.page_tokens);
          worse += !ssa_test::is_nearest_centroid(cb, h, m, z.data(), code);
        }
      }
    }
    CHECK(worse == 0);
    std::vector<float> lut, scores(n);
    for (uint32_t hq = 0; hq < n_q; ++hq) {
      const uint32_t h = hq / (n_q / n_kv);
      const float* q = w.q_test.data() + size_t{hq} * d;
      ssa::score_tokens(L, layer, h, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, scores.data());
      std::vector<double> qq(d, 0.0);
      for (uint32_t i = 0; i < d; ++i)
        for (uint32_t j = 0; j < d; ++j) qq[i] += double{cb.query_transform_of(h)[size_t{i} * d + j]} * q[j];
      double span = 0.0, worst = 0.0, magnitude = 0.0;
      for (uint32_t m = 0; m < M; ++m) {
        double lo = INFINITY, hi = -INFINITY;
        for (uint32_t c = 0; c < K; ++c) {
          double s2 = 0.0;
          for (uint32_t j = 0; j < sub; ++j) s2 += qq[m * sub + j] * cb.centroid(h, m, c)[j];
          lo = std::min(lo, s2);
          hi = std::max(hi, s2);
        }
        span = std::max(span, hi - lo);
      }
      for (uint32_t t = 0; t < n; ++t) {
        double ref = 0.0;
        for (uint32_t m = 0; m < M; ++m) {
          const uint32_t code = L.code_at(layer.code_pages[t / L.page_tokens]->data(), h, m, t % L.page_tokens);
          for (uint32_t j = 0; j < sub; ++j) ref += qq[m * sub + j] * cb.centroid(h, m, code)[j];
        }
        worst = std::max(worst, fabs(ref - scores[t]));
        magnitude = std::max(magnitude, fabs(ref));
      }
      const double bound = L.code_bits == 4 ? M * span / 255.0 / 2.0 * (1 + 1e-3) : 0.0;
      CHECK(worst <= bound + 1e-4 * magnitude + 1e-5);
    }
  }
}

TEST_CASE("on queries that read few directions, the query-aware proxy ranks far closer than PQ and OPQ") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 1, n_q = 2, n = 4000;
  const Workload w = make_workload(n, n_kv, n_q, d, 6, 400, 16, 75);
  double recall[5] = {0, 0, 0, 0, 0};
  const ssa_proxy proxies[5] = {SSA_PROXY_PQ, SSA_PROXY_OPQ, SSA_PROXY_QPQ, SSA_PROXY_PQ4, SSA_PROXY_QPQ4};
  std::vector<float> lut, exact(n), got(n);
  for (int p = 0; p < 5; ++p) {
    SessionPtr s = trained(rt.get(), w, proxies[p]);
    std::shared_lock lock(s->mu);
    for (size_t i = 0; i < w.q_test.size() / d; ++i) {
      const float* q = w.q_test.data() + i * d;
      ssa::score_tokens(s->layout, s->layers[0], 0, q, SSA_METHOD_ORACLE_TOPK, 0, n, &lut, exact.data());
      ssa::score_tokens(s->layout, s->layers[0], 0, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, got.data());
      recall[p] += recall_at(exact, got, n / 50) / (w.q_test.size() / d);
    }
  }
  MESSAGE("top-2% recall: PQ " << recall[0] << ", OPQ " << recall[1] << ", QPQ " << recall[2] << ", PQ4 "
                                << recall[3] << ", QPQ4 " << recall[4]);
  CHECK(recall[2] > recall[1] + 0.15);
  CHECK(recall[2] > recall[0] + 0.15);
  CHECK(recall[4] > recall[3] + 0.15);
}

TEST_CASE("observe_queries refuses what it cannot use and changes nothing; a layer shown none trains as OPQ starts") {
  auto rt = make_runtime(1);
  const Workload w = make_workload(300, 1, 2, 32, 4, 10, 1, 76);
  {
    SessionPtr s = make_session(rt.get(), qpq_config(w, SSA_PROXY_OPQ));
    CHECK(ssa_session_observe_queries(s.get(), 0, w.q_train.data(), 10) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(std::string(ssa_last_error_message()).find("learns nothing from queries") != std::string::npos);
  }
  SessionPtr s = make_session(rt.get(), qpq_config(w, SSA_PROXY_QPQ));
  CHECK(ssa_session_observe_queries(nullptr, 0, w.q_train.data(), 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_observe_queries(s.get(), 1, w.q_train.data(), 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_observe_queries(s.get(), 0, nullptr, 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_observe_queries(s.get(), 0, nullptr, 0) == SSA_OK);
  CHECK(ssa_session_observe_queries(s.get(), 0, w.q_train.data(), uint64_t{1} << 40) == SSA_ERR_INVALID_ARGUMENT);
  std::vector<float> nan_q = w.q_train;
  nan_q[2 * 32 + 5] = NAN;  // the second query's first head
  CHECK(ssa_session_observe_queries(s.get(), 0, nan_q.data(), 10) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ssa_last_error_message()).find("NaN") != std::string::npos);
  {
    std::shared_lock lock(s->mu);
    CHECK(s->layers[0].query_moments == nullptr);
  }
  // Refusals after queries were observed keep the moments as they were.
  {
    SessionPtr seen = make_session(rt.get(), qpq_config(w, SSA_PROXY_QPQ));
    SSA_CHECK_OK(ssa_session_observe_queries(seen.get(), 0, w.q_train.data(), 3));
    ssa::QueryMomentsRef before;
    {
      std::shared_lock lock(seen->mu);
      before = seen->layers[0].query_moments;
    }
    REQUIRE(before != nullptr);
    const std::vector<double> sum = before->sum;
    CHECK(ssa_session_observe_queries(seen.get(), 0, nan_q.data(), 10) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(ssa_session_observe_queries(seen.get(), 0, w.q_train.data(), uint64_t{1} << 40) ==
          SSA_ERR_INVALID_ARGUMENT);
    CHECK(ssa_session_observe_queries(seen.get(), 3, w.q_train.data(), 1) == SSA_ERR_INVALID_ARGUMENT);
    std::shared_lock lock(seen->mu);
    CHECK(seen->layers[0].query_moments == before);
    CHECK(before->sum == sum);
    CHECK(before->count[0] == 3 * 2);
  }
  // Trained with no queries: T = Q, orthogonal.
  append_f32(s.get(), 0, w.k, w.v, w.n, SSA_DTYPE_F32);
  std::shared_lock lock(s->mu);
  const ssa::PqCodebooks& cb = *s->layers[0].codebooks;
  CHECK(cb.trained_moments == nullptr);
  CHECK(cb.rotation == cb.query_transform);
  CHECK(ssa::orthogonality_error(cb.rotation_of(0), 32) < 1e-5);
}
