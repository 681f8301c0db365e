#include "query_transform.h"

#include <math.h>
#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/thread_pool.h"
#include "rotation.h"

namespace ssa {

QueryWhitening query_whitening(const double* moment_sum, uint64_t count, uint32_t d) {
  // A (keys) and A^-T (queries), row-major; the identity without queries.
  QueryWhitening w;
  std::vector<double>& a = w.a;
  std::vector<double>& a_inv_t = w.a_inv_t;
  a.assign(size_t{d} * d, 0.0);
  a_inv_t.assign(size_t{d} * d, 0.0);
  for (uint32_t i = 0; i < d; ++i) a[size_t{i} * d + i] = a_inv_t[size_t{i} * d + i] = 1.0;
  if (moment_sum != nullptr && count > 0) {
    std::vector<double> s(size_t{d} * d);
    for (uint32_t i = 0; i < d; ++i)
      for (uint32_t j = 0; j < d; ++j)
        s[size_t{i} * d + j] = 0.5 * (moment_sum[size_t{i} * d + j] + moment_sum[size_t{j} * d + i]) / count;
    // Symmetric positive semi-definite: eigenvalues >= 0 up to rounding (the
    // floor below raises the smallest).
    const SymmetricEigen eig = symmetric_eigen(s, d);
    const double top = *std::max_element(eig.values.begin(), eig.values.end());
    if (top > 0.0 && std::isfinite(top)) {
      for (uint32_t e = 0; e < d; ++e) {
        const double root = sqrt(std::max(eig.values[e], top * kQueryEigenFloor));
        for (uint32_t j = 0; j < d; ++j) {
          const double v = eig.vectors[size_t{j} * d + e];
          a[size_t{e} * d + j] = root * v;
          a_inv_t[size_t{e} * d + j] = v / root;
        }
      }
    }
  }
  w.a_t.resize(size_t{d} * d);
  for (uint32_t r = 0; r < d; ++r)
    for (uint32_t j = 0; j < d; ++j) w.a_t[size_t{j} * d + r] = a[size_t{r} * d + j];
  return w;
}

void whiten_keys(const QueryWhitening& w, const float* x, size_t i0, size_t i1, uint32_t d, float* y) {
  // y = A x for every key, each y[r] summed over j in order, all r at once
  // (A^T's rows are contiguous in r): the sums of a row-by-row dot product,
  // without its chain of dependent additions.
  std::vector<double> acc(d);
  for (size_t i = i0; i < i1; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (uint32_t j = 0; j < d; ++j) {
      const double xj = x[i * d + j];
      const double* col = w.a_t.data() + size_t{j} * d;
      for (uint32_t r = 0; r < d; ++r) acc[r] += col[r] * xj;
    }
    for (uint32_t r = 0; r < d; ++r) y[i * d + r] = static_cast<float>(acc[r]);
  }
}

void finish_query_transform(const QueryWhitening& w, const std::vector<double>& rot, uint32_t d, float* t,
                            float* q) {
  // T = R A and Q = R A^-T, row i of each summed over k in order for all j at
  // once (the rows of A and A^-T are contiguous in j).
  std::vector<double> tk(d), tq(d);
  for (uint32_t i = 0; i < d; ++i) {
    std::fill(tk.begin(), tk.end(), 0.0);
    std::fill(tq.begin(), tq.end(), 0.0);
    for (uint32_t k = 0; k < d; ++k) {
      const double r = rot[size_t{i} * d + k];
      const double* a = w.a.data() + size_t{k} * d;
      const double* ai = w.a_inv_t.data() + size_t{k} * d;
      for (uint32_t j = 0; j < d; ++j) {
        tk[j] += r * a[j];
        tq[j] += r * ai[j];
      }
    }
    for (uint32_t j = 0; j < d; ++j) {
      t[size_t{i} * d + j] = static_cast<float>(tk[j]);
      q[size_t{i} * d + j] = static_cast<float>(tq[j]);
    }
  }
}

void query_aware_transform(const float* x, size_t n, uint32_t d, uint32_t subspaces, const double* moment_sum,
                           uint64_t count, float* t, float* q) {
  const QueryWhitening w = query_whitening(moment_sum, count, d);
  std::vector<float> y(n * d);
  whiten_keys(w, x, 0, n, d, y.data());
  finish_query_transform(w, balanced_pca_rotation(y.data(), n, d, subspaces), d, t, q);
}

namespace {

// s[a][b] += x_i[a] x_i[b] for the n rows x_i (row-major [n][d] doubles),
// added to each element in the rows' order, for a <= b (and some a > b, with the
// same sums). Each product of two widened floats is exact, so an element's bits
// depend on that order only: they are a row-at-a-time update's. Tiles of 4 x 8
// elements are summed in registers over blocks of rows that stay in cache (d a
// multiple of 8, as sessions' head dims are); a row-at-a-time update reads and
// writes all of s for every query.
void add_outer_products(const double* x, size_t n, uint32_t d, double* s) {
  if (d % 8 != 0) {
    for (size_t i = 0; i < n; ++i)
      for (uint32_t a = 0; a < d; ++a)
        for (uint32_t b = a; b < d; ++b) s[size_t{a} * d + b] += x[i * d + a] * x[i * d + b];
    return;
  }
  constexpr size_t kRowBlock = 64;
  for (size_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const size_t i1 = std::min(n, i0 + kRowBlock);
    for (uint32_t a0 = 0; a0 < d; a0 += 4)
      for (uint32_t b0 = a0 / 8 * 8; b0 < d; b0 += 8) {
        double acc[4][8];
        for (uint32_t r = 0; r < 4; ++r)
          for (uint32_t c = 0; c < 8; ++c) acc[r][c] = s[size_t{a0 + r} * d + b0 + c];
        for (size_t i = i0; i < i1; ++i) {
          const double* xi = x + i * d;
          for (uint32_t r = 0; r < 4; ++r)
            for (uint32_t c = 0; c < 8; ++c) acc[r][c] += xi[a0 + r] * xi[b0 + c];
        }
        for (uint32_t r = 0; r < 4; ++r)
          for (uint32_t c = 0; c < 8; ++c) s[size_t{a0 + r} * d + b0 + c] = acc[r][c];
      }
  }
}

}  // namespace

std::shared_ptr<QueryMoments> add_query_moments(const QueryMoments* prev, uint32_t n_kv, uint32_t n_q, uint32_t d,
                                                const float* q, uint64_t n, ThreadPool* pool) {
  auto m = prev != nullptr ? std::make_shared<QueryMoments>(*prev) : std::make_shared<QueryMoments>();
  if (prev == nullptr) {
    m->n_kv_heads = n_kv;
    m->head_dim = d;
    m->count.assign(n_kv, 0);
    m->sum.assign(size_t{n_kv} * d * d, 0.0);
  }
  if (m->recent_count.empty()) {  // moments read from a file that kept no recent queries
    m->recent_count.assign(n_kv, 0);
    m->recent.assign(size_t{n_kv} * kRecentQueries * d, 0.0f);
  }
  const uint32_t g = n_q / n_kv;
  // Each KV head's sums and window are its own: the heads run in parallel.
  auto add_head = [&](size_t h) {
    double* s = m->sum.data() + h * d * d;
    // The head's queries in order, (t, j), widened (exactly) to double.
    std::vector<double> rows(size_t{n} * g * d);
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t j = 0; j < g; ++j) {
        const float* x = q + (t * n_q + size_t{h} * g + j) * d;
        std::copy(x, x + d, rows.begin() + (t * g + j) * d);
      }
    add_outer_products(rows.data(), size_t{n} * g, d, s);
    for (uint32_t a = 0; a < d; ++a)  // the sums stay exactly symmetric
      for (uint32_t b = 0; b < a; ++b) s[size_t{a} * d + b] = s[size_t{b} * d + a];
    m->count[h] += n * g;
    // The window of recent queries: the kept ones, then these, the last
    // kRecentQueries of them.
    float* kept = m->recent.data() + size_t{h} * kRecentQueries * d;
    const uint64_t fresh = n * g, have = m->recent_count[h];
    const uint64_t keep_old = fresh >= kRecentQueries ? 0 : std::min<uint64_t>(have, kRecentQueries - fresh);
    std::vector<float> window;
    window.reserve(size_t{kRecentQueries} * d);
    window.insert(window.end(), kept + (have - keep_old) * d, kept + have * d);
    for (uint64_t i = fresh - std::min<uint64_t>(fresh, kRecentQueries); i < fresh; ++i) {
      const uint64_t t = i / g, j = i % g;
      const float* x = q + (t * n_q + size_t{h} * g + j) * d;
      window.insert(window.end(), x, x + d);
    }
    std::fill(kept, kept + size_t{kRecentQueries} * d, 0.0f);
    std::copy(window.begin(), window.end(), kept);
    m->recent_count[h] = window.size() / d;
  };
  if (pool != nullptr) {
    pool->parallel_for(n_kv, add_head);
  } else {
    for (uint32_t h = 0; h < n_kv; ++h) add_head(h);
  }
  return m;
}

uint64_t query_moments_hash(const QueryMoments* m) {
  if (m == nullptr) return 0;
  const uint64_t seed = XXH3_64bits(m->count.data(), m->count.size() * sizeof(uint64_t));
  const uint64_t sums = XXH3_64bits_withSeed(m->sum.data(), m->sum.size() * sizeof(double), seed);
  const uint64_t counts = XXH3_64bits_withSeed(m->recent_count.data(), m->recent_count.size() * sizeof(uint64_t), sums);
  const uint64_t h = XXH3_64bits_withSeed(m->recent.data(), m->recent.size() * sizeof(float), counts);
  return h == 0 ? 1 : h;
}

double inverse_transpose_error(const float* t, const float* q, uint32_t d) {
  const size_t n = size_t{d} * d;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(t[i]) || !std::isfinite(q[i])) return std::numeric_limits<double>::infinity();
  }
  double worst = 0.0;
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) {
      double s = 0.0;
      for (uint32_t k = 0; k < d; ++k) s += double{t[size_t{k} * d + i]} * q[size_t{k} * d + j];
      worst = std::max(worst, fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

}  // namespace ssa
