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

SymmetricEigen symmetric_eigen(const std::vector<double>& a, uint32_t d) {
  // Householder reduction to tridiagonal form with the transforms accumulated in
  // v, then implicit QL iterations with Wilkinson-like shifts on the tridiagonal
  // matrix, rotating v along (the EISPACK tred2/tql2 pair). About 10 d^3 flops:
  // a few milliseconds at d = 128, where one-sided Jacobi sweeps took tens.
  // V(i, j) is stored at v[j][i]: the inner loops below run down V's columns, so
  // that each runs over contiguous memory (the same operations in the same order
  // as on row-major storage: the same bits, 4-5x sooner at d 128).
  const uint32_t n = d;
  SymmetricEigen out;
  std::vector<double>& w = out.values;
  w.assign(n, 0.0);
  if (n == 0) return out;
  std::vector<double> v(size_t{n} * n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t j = 0; j < n; ++j) v[size_t{j} * n + i] = a[size_t{i} * n + j];
  std::vector<double> e(n, 0.0);
  auto V = [&](uint32_t i, uint32_t j) -> double& { return v[size_t{j} * n + i]; };
  for (uint32_t j = 0; j < n; ++j) w[j] = V(n - 1, j);
  for (uint32_t i = n - 1; i > 0; --i) {
    double scale = 0.0, h = 0.0;
    for (uint32_t k = 0; k < i; ++k) scale += fabs(w[k]);
    if (scale == 0.0) {
      e[i] = w[i - 1];
      for (uint32_t j = 0; j < i; ++j) {
        w[j] = V(i - 1, j);
        V(i, j) = 0.0;
        V(j, i) = 0.0;
      }
    } else {
      for (uint32_t k = 0; k < i; ++k) {
        w[k] /= scale;
        h += w[k] * w[k];
      }
      double f = w[i - 1], g = sqrt(h);
      if (f > 0) g = -g;
      e[i] = scale * g;
      h -= f * g;
      w[i - 1] = f - g;
      for (uint32_t j = 0; j < i; ++j) e[j] = 0.0;
      for (uint32_t j = 0; j < i; ++j) {
        f = w[j];
        V(j, i) = f;
        g = e[j] + V(j, j) * f;
        for (uint32_t k = j + 1; k < i; ++k) {
          g += V(k, j) * w[k];
          e[k] += V(k, j) * f;
        }
        e[j] = g;
      }
      f = 0.0;
      for (uint32_t j = 0; j < i; ++j) {
        e[j] /= h;
        f += e[j] * w[j];
      }
      const double hh = f / (h + h);
      for (uint32_t j = 0; j < i; ++j) e[j] -= hh * w[j];
      for (uint32_t j = 0; j < i; ++j) {
        f = w[j];
        g = e[j];
        for (uint32_t k = j; k < i; ++k) V(k, j) -= (f * e[k] + g * w[k]);
        w[j] = V(i - 1, j);
        V(i, j) = 0.0;
      }
    }
    w[i] = h;
  }
  for (uint32_t i = 0; i + 1 < n; ++i) {  // accumulate the transforms
    V(n - 1, i) = V(i, i);
    V(i, i) = 1.0;
    const double h = w[i + 1];
    if (h != 0.0) {
      for (uint32_t k = 0; k <= i; ++k) w[k] = V(k, i + 1) / h;
      for (uint32_t j = 0; j <= i; ++j) {
        double g = 0.0;
        for (uint32_t k = 0; k <= i; ++k) g += V(k, i + 1) * V(k, j);
        for (uint32_t k = 0; k <= i; ++k) V(k, j) -= g * w[k];
      }
    }
    for (uint32_t k = 0; k <= i; ++k) V(k, i + 1) = 0.0;
  }
  for (uint32_t j = 0; j < n; ++j) {
    w[j] = V(n - 1, j);
    V(n - 1, j) = 0.0;
  }
  V(n - 1, n - 1) = 1.0;

  for (uint32_t i = 1; i < n; ++i) e[i - 1] = e[i];
  e[n - 1] = 0.0;
  double f = 0.0, tst1 = 0.0;
  const double eps = ldexp(1.0, -52);
  for (uint32_t l = 0; l < n; ++l) {
    tst1 = std::max(tst1, fabs(w[l]) + fabs(e[l]));
    uint32_t m = l;
    while (m < n - 1 && !(fabs(e[m]) <= eps * tst1)) ++m;
    if (m > l) {
      // A bounded number of QL steps: non-finite input must not loop forever.
      for (int iter = 0; iter < 64; ++iter) {
        double g = w[l];
        double p = (w[l + 1] - g) / (2.0 * e[l]);
        double r = std::hypot(p, 1.0);
        if (p < 0) r = -r;
        w[l] = e[l] / (p + r);
        w[l + 1] = e[l] * (p + r);
        const double dl1 = w[l + 1];
        double h = g - w[l];
        for (uint32_t i = l + 2; i < n; ++i) w[i] -= h;
        f += h;
        p = w[m];
        double c = 1.0, c2 = 1.0, c3 = 1.0, s = 0.0, s2 = 0.0;
        const double el1 = e[l + 1];
        for (uint32_t i = m; i-- > l;) {
          c3 = c2;
          c2 = c;
          s2 = s;
          g = c * e[i];
          h = c * p;
          r = std::hypot(p, e[i]);
          e[i + 1] = s * r;
          s = e[i] / r;
          c = p / r;
          p = c * w[i] - s * g;
          w[i + 1] = h + s * (c * g + s * w[i]);
          for (uint32_t k = 0; k < n; ++k) {
            h = V(k, i + 1);
            V(k, i + 1) = s * V(k, i) + c * h;
            V(k, i) = c * V(k, i) - s * h;
          }
        }
        p = -s * s2 * c3 * el1 * e[l] / dl1;
        e[l] = s * p;
        w[l] = c * p;
        if (!(fabs(e[l]) > eps * tst1)) break;
      }
    }
    w[l] += f;
    e[l] = 0.0;
  }
  out.vectors.resize(size_t{n} * n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t j = 0; j < n; ++j) out.vectors[size_t{i} * n + j] = V(i, j);
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
  // Symmetric positive semi-definite: its eigenvalues are >= 0 up to rounding.
  const SymmetricEigen eig = symmetric_eigen(c, d);
  std::vector<uint32_t> order(d);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return eig.values[a] > eig.values[b]; });
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
    load[best] += eig.values[e];
    for (uint32_t i = 0; i < d; ++i) r[size_t{out_row} * d + i] = eig.vectors[size_t{i} * d + e];
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
