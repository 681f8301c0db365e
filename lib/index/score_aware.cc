#include "score_aware.h"

#include <math.h>

#include <algorithm>

#include "kmeans.h"

namespace ssa {
namespace {

double dot(const float* a, const float* b, uint32_t n) {
  double s = 0.0;
  for (uint32_t j = 0; j < n; ++j) s += double{a[j]} * b[j];
  return s;
}

// Solves a x = b in place (b receives x) for a symmetric positive definite
// n x n row-major a (destroyed) by Cholesky. Returns false if a pivot is not
// positive (cannot happen for n_c I + sum w x x^T with n_c >= 1, w >= 0, but
// rounding is checked rather than trusted).
bool cholesky_solve(std::vector<double>& a, std::vector<double>& b, uint32_t n) {
  for (uint32_t j = 0; j < n; ++j) {
    double d = a[size_t{j} * n + j];
    for (uint32_t k = 0; k < j; ++k) d -= a[size_t{j} * n + k] * a[size_t{j} * n + k];
    if (!(d > 0.0)) return false;
    const double l = sqrt(d);
    a[size_t{j} * n + j] = l;
    for (uint32_t i = j + 1; i < n; ++i) {
      double s = a[size_t{i} * n + j];
      for (uint32_t k = 0; k < j; ++k) s -= a[size_t{i} * n + k] * a[size_t{j} * n + k];
      a[size_t{i} * n + j] = s / l;
    }
  }
  for (uint32_t i = 0; i < n; ++i) {  // L y = b
    double s = b[i];
    for (uint32_t k = 0; k < i; ++k) s -= a[size_t{i} * n + k] * b[k];
    b[i] = s / a[size_t{i} * n + i];
  }
  for (uint32_t i = n; i-- > 0;) {  // L^T x = y
    double s = b[i];
    for (uint32_t k = i + 1; k < n; ++k) s -= a[size_t{k} * n + i] * b[k];
    b[i] = s / a[size_t{i} * n + i];
  }
  return true;
}

}  // namespace

ScoreAwareSearch::ScoreAwareSearch(const float* centroids, uint32_t M, uint32_t K, uint32_t sub_dim, double eta)
    : centroids_(centroids), M_(M), K_(K), sub_(sub_dim), eta_(eta), norms_(size_t{M} * K) {
  for (size_t i = 0; i < norms_.size(); ++i) {
    const float* c = centroids + i * sub_dim;
    norms_[i] = dot(c, c, sub_dim);
  }
}

void ScoreAwareSearch::assign(const float* x, uint32_t* codes) const {
  const double xx = dot(x, x, M_ * sub_);
  if (!(xx > 0.0)) return;
  const double w = (eta_ - 1.0) / xx;
  // Per subspace: |x_m|^2, and the current code's part of r . x.
  std::vector<double> xm2(M_), part(M_);
  double p = 0.0;  // r . x
  for (uint32_t m = 0; m < M_; ++m) {
    const float* xm = x + size_t{m} * sub_;
    xm2[m] = dot(xm, xm, sub_);
    part[m] = xm2[m] - dot(xm, centroids_ + (size_t{m} * K_ + codes[m]) * sub_, sub_);
    p += part[m];
  }
  for (uint32_t sweep = 0; sweep < kScoreAwareSweeps; ++sweep) {
    bool changed = false;
    for (uint32_t m = 0; m < M_; ++m) {
      const float* xm = x + size_t{m} * sub_;
      const double rest = p - part[m];
      // |x_m - c|^2 = |x_m|^2 - 2 x_m.c + |c|^2 and (x_m - c).x_m = |x_m|^2 - x_m.c.
      auto loss_of = [&](uint32_t c, double* pm) {
        const double xc = dot(xm, centroids_ + (size_t{m} * K_ + c) * sub_, sub_);
        *pm = xm2[m] - xc;
        const double par = rest + *pm;
        return xm2[m] - 2.0 * xc + norms_[size_t{m} * K_ + c] + w * par * par;
      };
      uint32_t best = codes[m];
      double best_pm;
      double best_loss = loss_of(best, &best_pm);
      for (uint32_t c = 0; c < K_; ++c) {
        double pm;
        const double l = loss_of(c, &pm);
        if (l < best_loss) {
          best_loss = l;
          best = c;
          best_pm = pm;
        }
      }
      if (best != codes[m]) {
        changed = true;
        codes[m] = best;
      }
      part[m] = best_pm;
      p = rest + best_pm;
    }
    if (!changed) break;
  }
}

double ScoreAwareSearch::loss(const float* x, const uint32_t* codes) const {
  const double xx = dot(x, x, M_ * sub_);
  double rr = 0.0, rx = 0.0;
  for (uint32_t m = 0; m < M_; ++m) {
    const float* c = centroids_ + (size_t{m} * K_ + codes[m]) * sub_;
    for (uint32_t j = 0; j < sub_; ++j) {
      const double xj = x[size_t{m} * sub_ + j], r = xj - c[j];
      rr += r * r;
      rx += r * xj;
    }
  }
  return xx > 0.0 ? rr + (eta_ - 1.0) * rx * rx / xx : rr;
}

void score_aware_update_centroids(const float* x, size_t n, uint32_t M, uint32_t K, uint32_t sub_dim, double eta,
                                  const uint32_t* codes, float* centroids) {
  const uint32_t d = M * sub_dim;
  std::vector<double> xx(n), p(n);  // |x_i|^2 and r_i . x_i
  for (size_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    xx[i] = dot(xi, xi, d);
    double s = xx[i];
    for (uint32_t m = 0; m < M; ++m)
      s -= dot(xi + size_t{m} * sub_dim, centroids + (size_t{m} * K + codes[i * M + m]) * sub_dim, sub_dim);
    p[i] = s;
  }
  std::vector<double> a(size_t{K} * sub_dim * sub_dim), b(size_t{K} * sub_dim), ac, bc;
  std::vector<uint32_t> count(K);
  std::vector<float> old;
  for (uint32_t m = 0; m < M; ++m) {
    float* cm = centroids + size_t{m} * K * sub_dim;
    std::fill(a.begin(), a.end(), 0.0);
    std::fill(b.begin(), b.end(), 0.0);
    std::fill(count.begin(), count.end(), 0u);
    // A_c = n_c I + sum w_i x_im x_im^T,  b_c = sum x_im (1 + w_i (|x_im|^2 + rest_i)),
    // rest_i = r_i . x_i without subspace m's part: the zero of the gradient of
    // sum_i |x_im - c|^2 + w_i ((x_im - c) . x_im + rest_i)^2, w_i = (eta - 1) / |x_i|^2.
    for (size_t i = 0; i < n; ++i) {
      const float* xm = x + i * d + size_t{m} * sub_dim;
      const uint32_t c = codes[i * M + m];
      const double xm2 = dot(xm, xm, sub_dim);
      const double rest = p[i] - (xm2 - dot(xm, cm + size_t{c} * sub_dim, sub_dim));
      const double w = xx[i] > 0.0 ? (eta - 1.0) / xx[i] : 0.0;
      ++count[c];
      double* a_c = a.data() + size_t{c} * sub_dim * sub_dim;
      double* b_c = b.data() + size_t{c} * sub_dim;
      const double f = 1.0 + w * (xm2 + rest);
      for (uint32_t j = 0; j < sub_dim; ++j) {
        b_c[j] += f * xm[j];
        const double wx = w * xm[j];
        for (uint32_t k = 0; k < sub_dim; ++k) a_c[size_t{j} * sub_dim + k] += wx * xm[k];
      }
    }
    old.assign(cm, cm + size_t{K} * sub_dim);
    for (uint32_t c = 0; c < K; ++c) {
      if (count[c] == 0) continue;
      ac.assign(a.begin() + size_t{c} * sub_dim * sub_dim, a.begin() + size_t{c + 1} * sub_dim * sub_dim);
      bc.assign(b.begin() + size_t{c} * sub_dim, b.begin() + size_t{c + 1} * sub_dim);
      for (uint32_t j = 0; j < sub_dim; ++j) ac[size_t{j} * sub_dim + j] += count[c];
      if (!cholesky_solve(ac, bc, sub_dim)) continue;
      bool finite = true;
      for (double v : bc) finite &= std::isfinite(v);
      if (!finite) continue;
      for (uint32_t j = 0; j < sub_dim; ++j) cm[size_t{c} * sub_dim + j] = static_cast<float>(bc[j]);
    }
    // r . x moves with subspace m's centroids: keep p current for the next subspace.
    for (size_t i = 0; i < n; ++i) {
      const float* xm = x + i * d + size_t{m} * sub_dim;
      const uint32_t c = codes[i * M + m];
      p[i] += dot(xm, old.data() + size_t{c} * sub_dim, sub_dim) - dot(xm, cm + size_t{c} * sub_dim, sub_dim);
    }
  }
}

std::vector<double> score_aware_refine(const float* x, size_t n, uint32_t M, uint32_t K, uint32_t sub_dim,
                                       double eta, float* centroids) {
  const uint32_t d = M * sub_dim;
  std::vector<uint32_t> codes(n * M);
  {  // the k-means assignment to start from
    std::vector<CentroidSearch> nearest;
    nearest.reserve(M);
    for (uint32_t m = 0; m < M; ++m) nearest.emplace_back(centroids + size_t{m} * K * sub_dim, K, sub_dim);
    for (size_t i = 0; i < n; ++i)
      for (uint32_t m = 0; m < M; ++m) codes[i * M + m] = nearest[m].nearest(x + i * d + size_t{m} * sub_dim);
  }
  std::vector<double> losses;
  for (uint32_t round = 0; round <= kScoreAwareRounds; ++round) {
    const ScoreAwareSearch search(centroids, M, K, sub_dim, eta);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      search.assign(x + i * d, codes.data() + i * M);
      total += search.loss(x + i * d, codes.data() + i * M);
    }
    losses.push_back(total / static_cast<double>(std::max<size_t>(n, 1)));
    if (round == kScoreAwareRounds) break;
    score_aware_update_centroids(x, n, M, K, sub_dim, eta, codes.data(), centroids);
  }
  return losses;
}

}  // namespace ssa
