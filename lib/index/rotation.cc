#include "rotation.h"

#include <math.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace ssa {
namespace {

double dot(const double* a, const double* b, uint32_t d) {
  double s = 0.0;
  for (uint32_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// Completes the columns of uc (column-major, d columns of d) whose entry in
// `missing` is set to an orthonormal basis, by Gram-Schmidt on unit vectors.
void complete_basis(std::vector<double>& uc, const std::vector<bool>& missing, uint32_t d) {
  uint32_t next_unit = 0;
  for (uint32_t j = 0; j < d; ++j) {
    if (!missing[j]) continue;
    double* col = uc.data() + size_t{j} * d;
    for (; next_unit < d; ++next_unit) {
      std::fill(col, col + d, 0.0);
      col[next_unit] = 1.0;
      for (int pass = 0; pass < 2; ++pass) {  // twice: classical GS loses orthogonality once
        for (uint32_t k = 0; k < d; ++k) {
          if (k == j || (missing[k] && k > j)) continue;
          const double* other = uc.data() + size_t{k} * d;
          const double c = dot(col, other, d);
          for (uint32_t i = 0; i < d; ++i) col[i] -= c * other[i];
        }
      }
      const double norm = sqrt(dot(col, col, d));
      if (norm > 0.5) {
        for (uint32_t i = 0; i < d; ++i) col[i] /= norm;
        ++next_unit;
        break;
      }
    }
  }
}

}  // namespace

Svd jacobi_svd(const std::vector<double>& a, uint32_t d) {
  // One-sided Jacobi (Hestenes): rotate pairs of columns of W = A until all are
  // orthogonal; the same rotations applied to I give V, and then A V = W = U S.
  std::vector<double> wc(size_t{d} * d), vc(size_t{d} * d, 0.0);  // column-major
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) wc[size_t{j} * d + i] = a[size_t{i} * d + j];
    vc[size_t{i} * d + i] = 1.0;
  }
  constexpr int kMaxSweeps = 60;
  constexpr double kEps = 1e-15;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool rotated = false;
    for (uint32_t p = 0; p + 1 < d; ++p) {
      for (uint32_t q = p + 1; q < d; ++q) {
        double* wp = wc.data() + size_t{p} * d;
        double* wq = wc.data() + size_t{q} * d;
        const double alpha = dot(wp, wp, d), beta = dot(wq, wq, d), gamma = dot(wp, wq, d);
        if (gamma == 0.0 || fabs(gamma) <= kEps * sqrt(alpha * beta)) continue;
        rotated = true;
        const double zeta = (beta - alpha) / (2.0 * gamma);
        const double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
        const double c = 1.0 / sqrt(1.0 + t * t), s = c * t;
        double* vp = vc.data() + size_t{p} * d;
        double* vq = vc.data() + size_t{q} * d;
        for (uint32_t i = 0; i < d; ++i) {
          const double x = wp[i], y = wq[i];
          wp[i] = c * x - s * y;
          wq[i] = s * x + c * y;
          const double vx = vp[i], vy = vq[i];
          vp[i] = c * vx - s * vy;
          vq[i] = s * vx + c * vy;
        }
      }
    }
    if (!rotated) break;
  }
  Svd out;
  out.s.resize(d);
  double smax = 0.0;
  for (uint32_t j = 0; j < d; ++j) {
    out.s[j] = sqrt(dot(wc.data() + size_t{j} * d, wc.data() + size_t{j} * d, d));
    smax = std::max(smax, out.s[j]);
  }
  std::vector<bool> missing(d, false);
  bool any_missing = false;
  for (uint32_t j = 0; j < d; ++j) {
    double* col = wc.data() + size_t{j} * d;
    if (!(out.s[j] > 1e-12 * smax)) {
      missing[j] = any_missing = true;
      continue;
    }
    for (uint32_t i = 0; i < d; ++i) col[i] /= out.s[j];
  }
  if (any_missing) complete_basis(wc, missing, d);
  out.u.resize(size_t{d} * d);
  out.v.resize(size_t{d} * d);
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) {
      out.u[size_t{i} * d + j] = wc[size_t{j} * d + i];
      out.v[size_t{i} * d + j] = vc[size_t{j} * d + i];
    }
  }
  return out;
}

std::vector<double> procrustes(const std::vector<double>& m, uint32_t d) {
  const Svd svd = jacobi_svd(m, d);
  std::vector<double> r(size_t{d} * d, 0.0);
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t k = 0; k < d; ++k) {
      r[size_t{i} * d + k] = dot(svd.u.data() + size_t{i} * d, svd.v.data() + size_t{k} * d, d);
    }
  }
  return r;
}

void second_moment_rows(const float* x, size_t n, uint32_t d, uint32_t r0, uint32_t r1, double* c) {
  std::vector<double> row(d);
  for (uint32_t i = r0; i < r1; ++i) std::fill(c + size_t{i} * d + i, c + size_t{i + 1} * d, 0.0);
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t i = r0; i < d; ++i) row[i] = x[t * d + i];
    for (uint32_t i = r0; i < r1; ++i) {
      double* ci = c + size_t{i} * d;
      for (uint32_t j = i; j < d; ++j) ci[j] += row[i] * row[j];
    }
  }
}

std::vector<double> balanced_pca_rotation(const float* x, size_t n, uint32_t d, uint32_t subspaces) {
  std::vector<double> c(size_t{d} * d, 0.0);
  second_moment_rows(x, n, d, 0, d, c.data());
  return balanced_rotation_of(std::move(c), d, subspaces);
}

std::vector<double> balanced_rotation_of(std::vector<double> c, uint32_t d, uint32_t subspaces) {
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < i; ++j) c[size_t{i} * d + j] = c[size_t{j} * d + i];
  }
  // The matrix is symmetric positive semi-definite: its V holds the
  // eigenvectors, its singular values are the eigenvalues.
  const Svd eig = jacobi_svd(c, d);
  std::vector<uint32_t> order(d);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return eig.s[a] > eig.s[b]; });
  const uint32_t sub = d / subspaces;
  std::vector<double> load(subspaces, 0.0);
  std::vector<uint32_t> filled(subspaces, 0);
  std::vector<double> r(size_t{d} * d);
  for (const uint32_t e : order) {
    uint32_t best = subspaces;
    for (uint32_t m = 0; m < subspaces; ++m) {
      if (filled[m] < sub && (best == subspaces || load[m] < load[best])) best = m;
    }
    const uint32_t out_row = best * sub + filled[best]++;
    load[best] += eig.s[e];
    for (uint32_t i = 0; i < d; ++i) r[size_t{out_row} * d + i] = eig.v[size_t{i} * d + e];
  }
  return r;
}

double orthogonality_error(const float* r, uint32_t d) {
  const size_t n = size_t{d} * d;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(r[i])) return std::numeric_limits<double>::infinity();
  }
  double worst = 0.0;
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = i; j < d; ++j) {
      double s = 0.0;
      for (uint32_t k = 0; k < d; ++k) s += double{r[size_t{i} * d + k]} * r[size_t{j} * d + k];
      worst = std::max(worst, fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

}  // namespace ssa
