// Small helpers the benchmarks share: stop at a failed call with its message,
// the median of a sample, a monotonic clock in microseconds.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "ssa.h"

namespace ssa_bench {

inline void check(ssa_status st, const char* what) {
  if (st != SSA_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, ssa_status_string(st), ssa_last_error_message());
    exit(1);
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ssa_bench
