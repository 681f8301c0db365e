// The proxies of ssa_session_config.proxy: the linear algebra of OPQ against
// independent checks, OPQ codes and scores against a float64 reference built
// from the stored codebooks and rotation, and OPQ against PQ on keys whose
// structure a rotation can find.
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
#include <random>
#include <shared_mutex>
#include <vector>

#include "decode/candidate_scores.h"
#include "index/rotation.h"
#include "session.h"
#include "support/pq_reference.h"
#include "support/session_helpers.h"

using namespace ssa_test;

namespace {

std::vector<double> random_matrix(uint32_t d, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> a(size_t{d} * d);
  for (double& x : a) x = nd(rng);
  return a;
}

// max |A B^T - I| for row-major square matrices (A = B: orthogonality of rows).
double max_gram_error(const std::vector<double>& a, const std::vector<double>& b, uint32_t d) {
  double worst = 0.0;
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) {
      double s = 0.0;
      for (uint32_t k = 0; k < d; ++k) s += a[size_t{i} * d + k] * b[size_t{j} * d + k];
      worst = std::max(worst, fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

std::vector<double> transpose(const std::vector<double>& a, uint32_t d) {
  std::vector<double> t(a.size());
  for (uint32_t i = 0; i < d; ++i)
    for (uint32_t j = 0; j < d; ++j) t[size_t{j} * d + i] = a[size_t{i} * d + j];
  return t;
}

// A random orthogonal matrix: Gram-Schmidt on Gaussian rows (an independent route).
std::vector<double> random_orthogonal(uint32_t d, std::mt19937_64& rng) {
  std::vector<double> q = random_matrix(d, rng);
  for (uint32_t i = 0; i < d; ++i) {
    double* r = q.data() + size_t{i} * d;
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t j = 0; j < i; ++j) {
        const double* o = q.data() + size_t{j} * d;
        double c = 0.0;
        for (uint32_t k = 0; k < d; ++k) c += r[k] * o[k];
        for (uint32_t k = 0; k < d; ++k) r[k] -= c * o[k];
      }
    }
    double n = 0.0;
    for (uint32_t k = 0; k < d; ++k) n += r[k] * r[k];
    for (uint32_t k = 0; k < d; ++k) r[k] /= sqrt(n);
  }
  return q;
}

}  // namespace

// symmetric_eigen against its contract: A v_e = lambda_e v_e for every column
// (residual relative to A's largest entry), V orthogonal, and the eigenvalues
// those of an independent route (the squares of jacobi_svd's singular values of
// A: A^T A = V diag(lambda^2) V^T); for random symmetric matrices of both signs,
// rank-deficient PSD ones, a repeated eigenvalue, a diagonal one and d = 1.
TEST_CASE("symmetric_eigen: A V = V diag(values), V orthogonal, values agree with an SVD") {
  std::mt19937_64 rng(29);
  for (uint32_t d : {1u, 8u, 33u, 128u, 256u}) {
    for (int kind = 0; kind < 4; ++kind) {
      CAPTURE(d);
      CAPTURE(kind);
      std::vector<double> a(size_t{d} * d, 0.0);
      if (kind == 0) {  // symmetric, eigenvalues of both signs
        const std::vector<double> b = random_matrix(d, rng);
        for (uint32_t i = 0; i < d; ++i)
          for (uint32_t j = 0; j < d; ++j) a[size_t{i} * d + j] = b[size_t{i} * d + j] + b[size_t{j} * d + i];
      } else if (kind == 1) {  // PSD of rank d/2 (a second moment of d/2 directions)
        const std::vector<double> b = random_matrix(d, rng);
        for (uint32_t i = 0; i < d; ++i)
          for (uint32_t j = 0; j < d; ++j)
            for (uint32_t k = 0; k < (d + 1) / 2; ++k)
              a[size_t{i} * d + j] += b[size_t{k} * d + i] * b[size_t{k} * d + j];
      } else if (kind == 2) {  // 3 I plus a rank-one term: eigenvalue 3 repeated d - 1 times
        const std::vector<double> b = random_matrix(d, rng);
        for (uint32_t i = 0; i < d; ++i)
          for (uint32_t j = 0; j < d; ++j) a[size_t{i} * d + j] = (i == j ? 3.0 : 0.0) + b[i] * b[j];
      } else {  // diagonal
        for (uint32_t i = 0; i < d; ++i) a[size_t{i} * d + i] = static_cast<double>(i % 7) - 2.5;
      }
      const ssa::SymmetricEigen eig = ssa::symmetric_eigen(a, d);
      REQUIRE(eig.values.size() == d);
      REQUIRE(eig.vectors.size() == size_t{d} * d);
      double scale = 0.0;
      for (double x : a) scale = std::max(scale, fabs(x));
      double worst = 0.0;
      for (uint32_t e = 0; e < d; ++e)
        for (uint32_t i = 0; i < d; ++i) {
          double av = 0.0;
          for (uint32_t k = 0; k < d; ++k) av += a[size_t{i} * d + k] * eig.vectors[size_t{k} * d + e];
          worst = std::max(worst, fabs(av - eig.values[e] * eig.vectors[size_t{i} * d + e]));
        }
      CHECK(worst < 1e-12 * d * std::max(scale, 1.0));
      CHECK(max_gram_error(transpose(eig.vectors, d), transpose(eig.vectors, d), d) < 1e-12 * d);
      std::vector<double> mine(d), other(d);
      const ssa::Svd svd = ssa::jacobi_svd(a, d);
      for (uint32_t e = 0; e < d; ++e) {
        mine[e] = fabs(eig.values[e]);
        other[e] = svd.s[e];
      }
      std::sort(mine.begin(), mine.end());
      std::sort(other.begin(), other.end());
      for (uint32_t e = 0; e < d; ++e) CHECK(fabs(mine[e] - other[e]) <= 1e-10 * d * std::max(scale, 1.0));
    }
  }
}

TEST_CASE("jacobi_svd reconstructs random and rank-deficient matrices with orthogonal factors") {
  std::mt19937_64 rng(11);
  for (uint32_t d : {8u, 33u, 64u}) {
    for (int deficient = 0; deficient < 2; ++deficient) {
      CAPTURE(d);
      CAPTURE(deficient);
      std::vector<double> a = random_matrix(d, rng);
      if (deficient) {  // rank d/2: the lower half of the rows repeats the upper half
        for (uint32_t i = d / 2; i < d; ++i)
          for (uint32_t j = 0; j < d; ++j) a[size_t{i} * d + j] = a[size_t{i - d / 2} * d + j];
      }
      const ssa::Svd svd = ssa::jacobi_svd(a, d);
      CHECK(max_gram_error(transpose(svd.u, d), transpose(svd.u, d), d) < 1e-9);
      CHECK(max_gram_error(transpose(svd.v, d), transpose(svd.v, d), d) < 1e-9);
      double worst = 0.0, scale = 0.0;
      for (uint32_t i = 0; i < d; ++i) {
        for (uint32_t j = 0; j < d; ++j) {
          double s = 0.0;
          for (uint32_t k = 0; k < d; ++k) s += svd.u[size_t{i} * d + k] * svd.s[k] * svd.v[size_t{j} * d + k];
          worst = std::max(worst, fabs(s - a[size_t{i} * d + j]));
          scale = std::max(scale, fabs(a[size_t{i} * d + j]));
        }
      }
      CHECK(worst < 1e-9 * scale * d);
      for (double s : svd.s) CHECK(s >= 0.0);
    }
  }
}

TEST_CASE("procrustes recovers the rotation that maps points onto their images") {
  std::mt19937_64 rng(12);
  std::normal_distribution<double> nd;
  for (uint32_t d : {16u, 64u}) {
    const std::vector<double> q = random_orthogonal(d, rng);
    // m = sum_t y_t x_t^T with y_t = Q x_t (+ a little noise).
    std::vector<double> m(size_t{d} * d, 0.0), x(d), y(d);
    for (int t = 0; t < 4 * int(d); ++t) {
      for (double& v : x) v = nd(rng);
      for (uint32_t i = 0; i < d; ++i) {
        y[i] = 1e-3 * nd(rng);
        for (uint32_t k = 0; k < d; ++k) y[i] += q[size_t{i} * d + k] * x[k];
      }
      for (uint32_t i = 0; i < d; ++i)
        for (uint32_t j = 0; j < d; ++j) m[size_t{i} * d + j] += y[i] * x[j];
    }
    const std::vector<double> r = ssa::procrustes(m, d);
    double worst = 0.0;
    for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, fabs(r[i] - q[i]));
    CAPTURE(d);
    CHECK(worst < 1e-2);
    CHECK(max_gram_error(r, r, d) < 1e-9);
  }
}

TEST_CASE("the balanced PCA rotation is orthogonal and spreads the variance over the subspaces") {
  std::mt19937_64 rng(13);
  std::normal_distribution<double> nd;
  const uint32_t d = 32, M = 8, n = 3000;
  const std::vector<double> q = random_orthogonal(d, rng);
  std::vector<float> x(size_t{n} * d);
  for (uint32_t t = 0; t < n; ++t) {
    std::vector<double> g(d);
    for (uint32_t i = 0; i < d; ++i) g[i] = nd(rng) * exp(-0.05 * i);  // decaying variances
    for (uint32_t i = 0; i < d; ++i) {
      double s = 0.0;
      for (uint32_t k = 0; k < d; ++k) s += q[size_t{i} * d + k] * g[k];
      x[size_t{t} * d + i] = static_cast<float>(s);
    }
  }
  const std::vector<double> r = ssa::balanced_pca_rotation(x.data(), n, d, M);
  CHECK(max_gram_error(r, r, d) < 1e-9);
  std::vector<float> rf(r.begin(), r.end());
  CHECK(ssa::orthogonality_error(rf.data(), d) < 1e-5);
  // Variance per subspace after the rotation: within a factor 1.5 of each other
  // (sorted PCA, 4 components per subspace, would give a factor of ~e^3 = 20
  // between the first subspace and the last).
  std::vector<double> var(M, 0.0);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t i = 0; i < d; ++i) {
      double z = 0.0;
      for (uint32_t k = 0; k < d; ++k) z += r[size_t{i} * d + k] * x[size_t{t} * d + k];
      var[i / (d / M)] += z * z;
    }
  }
  const auto [lo, hi] = std::minmax_element(var.begin(), var.end());
  CHECK(*hi < 1.5 * *lo);
}

TEST_CASE("orthogonality_error flags moved, non-finite and sheared matrices") {
  std::mt19937_64 rng(14);
  const uint32_t d = 16;
  const std::vector<double> q = random_orthogonal(d, rng);
  std::vector<float> r(q.begin(), q.end());
  CHECK(ssa::orthogonality_error(r.data(), d) < 1e-5);
  std::vector<float> bad = r;
  bad[5] += 0.02f;  // a unit column moved by 0.02: some entry of R R^T by >= 0.02 / sqrt(d)
  CHECK(ssa::orthogonality_error(bad.data(), d) > ssa::kRotationTolerance);
  bad = r;
  bad[17] = NAN;
  CHECK(!(ssa::orthogonality_error(bad.data(), d) <= ssa::kRotationTolerance));
  bad = r;
  bad[3] = INFINITY;
  CHECK(!(ssa::orthogonality_error(bad.data(), d) <= ssa::kRotationTolerance));
  bad = r;
  for (uint32_t j = 0; j < d; ++j) bad[d + j] += 0.01f * bad[j];  // row 1 leans on row 0
  CHECK(ssa::orthogonality_error(bad.data(), d) > ssa::kRotationTolerance);
}

namespace {

// Keys (and queries) with correlated coordinates: a random rotation of Gaussian
// components whose scales decay, plus a common offset. PQ in the given
// coordinates cuts across the strong directions; a rotation can align with them.
struct CorrelatedKeys {
  uint32_t d, n_kv, n;
  std::vector<float> k, v, q;  // k, v: [n][n_kv][d]; q: [n_q][d]
};

CorrelatedKeys correlated_keys(uint32_t n, uint32_t n_kv, uint32_t n_q, uint32_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  CorrelatedKeys c{d, n_kv, n, {}, {}, {}};
  std::vector<std::vector<double>> rot;
  for (uint32_t h = 0; h < n_kv; ++h) rot.push_back(random_orthogonal(d, rng));
  auto sample = [&](uint32_t h, float* out) {
    std::vector<double> g(d);
    for (uint32_t i = 0; i < d; ++i) g[i] = nd(rng) * 3.0 * exp(-0.08 * i) + (i == 0 ? 2.0 : 0.0);
    for (uint32_t i = 0; i < d; ++i) {
      double s = 0.0;
      for (uint32_t j = 0; j < d; ++j) s += rot[h][size_t{i} * d + j] * g[j];
      out[i] = static_cast<float>(s);
    }
  };
  c.k.resize(size_t{n} * n_kv * d);
  c.v.resize(c.k.size());
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t h = 0; h < n_kv; ++h) sample(h, c.k.data() + (size_t{t} * n_kv + h) * d);
  for (float& x : c.v) x = static_cast<float>(nd(rng));
  c.q.resize(size_t{n_q} * d);
  for (uint32_t h = 0; h < n_q; ++h) sample(h / (n_q / n_kv), c.q.data() + size_t{h} * d);
  return c;
}

SessionPtr indexed_session(ssa_runtime* rt, const CorrelatedKeys& data, uint32_t n_q, ssa_proxy proxy) {
  ssa_session_config c = make_config(1, n_q, data.n_kv, data.d, SSA_DTYPE_F32);
  c.pq_subspaces = 16;
  c.pq_centroids = 16;
  c.index_min_tokens = data.n;
  c.index_train_sample = data.n;
  c.index_iterations = 6;
  c.proxy = proxy;
  SessionPtr s = make_session(rt, c);
  append_f32(s.get(), 0, data.k, data.v, data.n, SSA_DTYPE_F32);
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

TEST_CASE("OPQ codes are the nearest centroids of the rotated keys, and its scores the rotated query's") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 4, n = 1500;
  const CorrelatedKeys data = correlated_keys(n, n_kv, n_q, d, 21);
  SessionPtr s = indexed_session(rt.get(), data, n_q, SSA_PROXY_OPQ);
  std::shared_lock lock(s->mu);
  const ssa::LayerStore& layer = s->layers[0];
  REQUIRE(layer.codebooks != nullptr);
  const ssa::PqCodebooks& cb = *layer.codebooks;
  REQUIRE(cb.rotated());
  const ssa::KvLayout& L = s->layout;
  const uint32_t M = L.pq_subspaces, K = L.pq_centroids, sub = L.sub_dim();
  for (uint32_t h = 0; h < n_kv; ++h) CHECK(ssa::orthogonality_error(cb.rotation_of(h), d) < 1e-4);
  size_t worse = 0;
  for (uint32_t h = 0; h < n_kv; ++h) {
    for (uint32_t t = 0; t < n; t += 7) {
      std::vector<double> z(d, 0.0);
      for (uint32_t i = 0; i < d; ++i)
        for (uint32_t j = 0; j < d; ++j)
          z[i] += double{cb.rotation_of(h)[size_t{i} * d + j]} * data.k[(size_t{t} * n_kv + h) * d + j];
      for (uint32_t m = 0; m < M; ++m) {
        const uint8_t code = layer.code_pages[t / L.page_tokens]->data()[L.code_offset(h, m) + t % L.page_tokens];
        REQUIRE(code < K);
        worse += !ssa_test::is_nearest_centroid(cb, h, m, z.data(), code);
      }
    }
  }
  CHECK(worse == 0);
  // Scores: the library's against sum_m (R q)_m . centroid[code_m] in float64.
  std::vector<float> lut, scores(n);
  for (uint32_t hq = 0; hq < n_q; ++hq) {
    const uint32_t h = hq / (n_q / n_kv);
    const float* q = data.q.data() + size_t{hq} * d;
    ssa::score_tokens(L, layer, h, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, scores.data());
    std::vector<double> rq(d, 0.0);
    for (uint32_t i = 0; i < d; ++i)
      for (uint32_t j = 0; j < d; ++j) rq[i] += double{cb.rotation_of(h)[size_t{i} * d + j]} * q[j];
    double worst = 0.0, scale = 0.0;
    for (uint32_t t = 0; t < n; ++t) {
      double ref = 0.0;
      for (uint32_t m = 0; m < M; ++m) {
        const uint8_t code = layer.code_pages[t / L.page_tokens]->data()[L.code_offset(h, m) + t % L.page_tokens];
        for (uint32_t j = 0; j < sub; ++j) ref += rq[m * sub + j] * cb.centroid(h, m, code)[j];
      }
      worst = std::max(worst, fabs(ref - scores[t]));
      scale = std::max(scale, fabs(ref));
    }
    CHECK(worst <= 1e-4 * scale + 1e-5);
  }
}

TEST_CASE("on correlated keys OPQ ranks closer to the exact scores than PQ at the same bytes") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 8, n = 4000;
  const CorrelatedKeys data = correlated_keys(n, n_kv, n_q, d, 22);
  SessionPtr pq = indexed_session(rt.get(), data, n_q, SSA_PROXY_PQ);
  SessionPtr opq = indexed_session(rt.get(), data, n_q, SSA_PROXY_OPQ);
  double recall_pq = 0.0, recall_opq = 0.0;
  std::vector<float> lut, exact(n), a(n), b(n);
  std::shared_lock l1(pq->mu), l2(opq->mu);
  for (uint32_t hq = 0; hq < n_q; ++hq) {
    const uint32_t h = hq / (n_q / n_kv);
    const float* q = data.q.data() + size_t{hq} * d;
    ssa::score_tokens(pq->layout, pq->layers[0], h, q, SSA_METHOD_ORACLE_TOPK, 0, n, &lut, exact.data());
    ssa::score_tokens(pq->layout, pq->layers[0], h, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, a.data());
    ssa::score_tokens(opq->layout, opq->layers[0], h, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, b.data());
    recall_pq += recall_at(exact, a, n / 20) / n_q;
    recall_opq += recall_at(exact, b, n / 20) / n_q;
  }
  MESSAGE("top-5% recall: PQ " << recall_pq << ", OPQ " << recall_opq);
  CHECK(recall_opq > recall_pq + 0.05);
}

TEST_CASE("an OPQ session decodes like a PQ one where the proxy does not matter (budget >= N)") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 4, n = 600;
  const CorrelatedKeys data = correlated_keys(n, n_kv, n_q, d, 23);
  SessionPtr pq = indexed_session(rt.get(), data, n_q, SSA_PROXY_PQ);
  SessionPtr opq = indexed_session(rt.get(), data, n_q, SSA_PROXY_OPQ);
  auto p = params(SSA_METHOD_SSA, n + 10);
  CHECK(run_decode(pq.get(), 0, data.q, SSA_DTYPE_F32, p) == run_decode(opq.get(), 0, data.q, SSA_DTYPE_F32, p));
  ssa_session_config got;
  ssa_session_config_init(&got);
  REQUIRE(ssa_session_get_config(opq.get(), &got) == SSA_OK);
  CHECK(got.proxy == SSA_PROXY_OPQ);
}
