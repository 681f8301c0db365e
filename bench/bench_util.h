// Small helpers the benchmarks share: stop at a failed call with its message,
// the median of a sample, a monotonic clock in microseconds. Session configs and
// runtime options come from the test support library (support/config.h).
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "ssa.h"
#include "support/config.h"

namespace ssa_bench {

inline void check(ssa_status st, const char* what) {
  if (st != SSA_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, ssa_status_string(st), ssa_last_error_message());
    exit(1);
  }
}

// The middle value (the mean of the two middle ones for an even count); NaN if empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ssa_bench
