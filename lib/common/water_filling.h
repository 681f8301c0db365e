// Adaptive heavy set of SSA: find lambda with sum_i min(1, lambda * q_i) = k'
// over the candidate tokens. Tokens with lambda * q_i >= 1 form the heavy set H.
//
// Only the largest values can be heavy (|H| <= k'), so the caller passes the
// top-n proxy probabilities sorted descending (n >= k' suffices) and the total
// probability mass of all candidates. With t heavy tokens the rest must satisfy
// lambda * (total - prefix_t) = k' - t; the answer is the smallest t whose lambda
// leaves token t+1 below 1 while token t stays at or above 1.
#pragma once

#include <stddef.h>

#include "host_device.h"

namespace ssa {

struct WaterFill {
  size_t heavy;   // |H|: the first `heavy` entries of the sorted input
  double lambda;  // 0 when k' covers every candidate with mass
};

// top_sorted: descending probabilities, n entries; total: mass of all candidates
// (>= sum of top_sorted); kprime: budget (> 0). Requires kprime < #candidates.
SSA_HD WaterFill water_fill(const double* top_sorted, size_t n, double total,
                            double kprime) {
  double prefix = 0.0;
  for (size_t t = 0; t < n && static_cast<double>(t) < kprime; ++t) {
    const double rest = total - prefix;
    if (rest <= 0.0) return WaterFill{t, 0.0};
    const double lambda = (kprime - static_cast<double>(t)) / rest;
    // Token t (0-based) is the largest of the rest: if it is not heavy under
    // this lambda, no later one is, and t heavy tokens is the fixed point.
    if (lambda * top_sorted[t] < 1.0) return WaterFill{t, lambda};
    prefix += top_sorted[t];
  }
  // Every listed token is heavy (n tokens, n <= kprime).
  const double rest = total - prefix;
  const size_t heavy = n;
  return WaterFill{heavy, rest > 0.0 ? (kprime - static_cast<double>(heavy)) / rest : 0.0};
}

}  // namespace ssa
