// Float64 attention references for tests: exact softmax attention and the
// self-normalised Horvitz-Thompson estimator over an explicit read set. They take
// plain arrays (the test's own copy of K and V), never the library's store.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <vector>

namespace ssa_test {

// K, V: [n][d] for one KV head; q: [d] (unscaled). Returns o = softmax(qK/sqrt d) V.
inline std::vector<double> dense_attention_f64(const double* q, const double* K, const double* V,
                                               size_t n, size_t d) {
  std::vector<double> s(n);
  double mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    double dot = 0.0;
    for (size_t j = 0; j < d; ++j) dot += q[j] * K[i * d + j];
    s[i] = dot / sqrt(static_cast<double>(d));
    if (s[i] > mx) mx = s[i];
  }
  std::vector<double> o(d, 0.0);
  double den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double w = exp(s[i] - mx);
    den += w;
    for (size_t j = 0; j < d; ++j) o[j] += w * V[i * d + j];
  }
  for (double& x : o) x /= den;
  return o;
}

// sum_{i in S} (w_i / pi_i) v_i / sum_{i in S} (w_i / pi_i) with w_i = exp(s_i).
inline std::vector<double> ht_attention_f64(const double* q, const double* K, const double* V,
                                            size_t d, const std::vector<uint32_t>& tokens,
                                            const std::vector<double>& log_pi) {
  std::vector<double> logits(tokens.size());
  double mx = -INFINITY;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const size_t i = tokens[r];
    double dot = 0.0;
    for (size_t j = 0; j < d; ++j) dot += q[j] * K[i * d + j];
    logits[r] = dot / sqrt(static_cast<double>(d)) - log_pi[r];
    if (logits[r] > mx) mx = logits[r];
  }
  std::vector<double> o(d, 0.0);
  double den = 0.0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const double w = exp(logits[r] - mx);
    den += w;
    for (size_t j = 0; j < d; ++j) o[j] += w * V[size_t{tokens[r]} * d + j];
  }
  for (double& x : o) x /= den;
  return o;
}

// Relative L2 error ||a - ref|| / ||ref|| over n values (either array float or
// double), in double: infinite when either holds a non-finite value or when ref
// is all zeros and a is not (0 when both are).
template <typename A, typename R>
inline double rel_l2(const A* a, const R* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], r = ref[i];
    if (!std::isfinite(x) || !std::isfinite(r)) return INFINITY;
    num += (x - r) * (x - r);
    den += r * r;
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return sqrt(num / den);
}

}  // namespace ssa_test
