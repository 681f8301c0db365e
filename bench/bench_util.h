// Small helpers the benchmarks share: stop at a failed call with its message,
// the median of a sample, a monotonic clock in microseconds, a /proc field. Session configs and
// runtime options come from the test support library (support/config.h).
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <string>
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

// The number after `key` on the first line of a /proc file that starts with it
// (kB fields: "VmRSS:" of /proc/self/status, "AnonHugePages:" of
// /proc/self/smaps_rollup); -1 when the file or the line is missing.
inline long proc_kib(const char* path, const char* key) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  const size_t n = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, n) == 0) {
      kib = strtol(line + n, nullptr, 10);
      break;
    }
  }
  fclose(f);
  return kib;
}

// A head shape of the CPU benchmarks: the paper's (16 q, 4 KV, d 256, f16) and
// Llama-3.1-8B's (32 q, 8 KV, d 128, bf16).
struct Shape {
  const char* name;
  uint32_t nq, nkv, d;
  ssa_dtype dtype;
};
constexpr Shape kCpuShapes[] = {{"paper 16q/4kv/d256/f16", 16, 4, 256, SSA_DTYPE_F16},
                                {"llama3-8b 32q/8kv/d128/bf16", 32, 8, 128, SSA_DTYPE_BF16}};

inline const char* method_name(ssa_method m) {
  switch (m) {
    case SSA_METHOD_DENSE: return "dense";
    case SSA_METHOD_ORACLE_TOPK: return "oracle_topk";
    case SSA_METHOD_PQ_TOPK: return "pq_topk";
    case SSA_METHOD_HYBRID_UNIFORM: return "hybrid_uniform";
    case SSA_METHOD_SAMPLING: return "sampling";
    case SSA_METHOD_SSA: return "ssa";
    default: return "ssa_adaptive";
  }
}

// "65536,262144" -> {65536, 262144}.
inline std::vector<uint64_t> parse_u64_list(const char* text) {
  std::vector<uint64_t> out;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    out.push_back(strtoull(p, &end, 10));
    p = *end == ',' ? end + 1 : end + strlen(end);
  }
  return out;
}

// Whether --configs (e.g. "paper,llama") names this shape (by its first word's prefix).
inline bool wants_shape(const std::string& configs, const Shape& s) {
  return configs.find(std::string(s.name).substr(0, 5)) != std::string::npos;
}

}  // namespace ssa_bench
