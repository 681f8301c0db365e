// Statistics of samples of decode errors: the two-sample Kolmogorov-Smirnov
// statistic (two backends' error distributions), the mean and its standard error.
#pragma once

#include <math.h>

#include <algorithm>
#include <vector>

namespace ssa_test {

// sup |F_a - F_b| of the two empirical distribution functions.
inline double ks_statistic(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  size_t i = 0, j = 0;
  double d = 0;
  while (i < a.size() && j < b.size()) {
    const double x = std::min(a[i], b[j]);
    while (i < a.size() && a[i] <= x) ++i;
    while (j < b.size() && b[j] <= x) ++j;
    d = std::max(d, fabs(double(i) / a.size() - double(j) / b.size()));
  }
  return d;
}

inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

inline double std_error(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return sqrt(s / (v.size() - 1) / v.size());
}

}  // namespace ssa_test
