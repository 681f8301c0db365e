// Latency of small appends to a CPU session as the layer grows: what one
// generated token costs per layer in an agent loop. Pages of 16 tokens make a
// long layer's page list (4096 pages at 64K tokens, as 1M tokens in 256-token
// pages) without filling gigabytes.
//
//   append_latency_bench [--reps R] [--index 0|1]
//
// For layers of 1K, 16K and 64K tokens: the median and p90 host time of R
// one-token appends; --index 1 trains a PQ index first, so each append also
// encodes its token.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench_util.h"
#include "ssa.h"

namespace {

constexpr uint32_t kNkv = 2, kD = 64, kNq = 8;

using ssa_bench::check;
using ssa_bench::now_us;

}  // namespace

int main(int argc, char** argv) {
  int reps = 2000;
  bool index = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--index")) index = atoi(argv[i + 1]) != 0;
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CPU);
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(&o, &rt), "runtime");

  const uint32_t chunk = 8192;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t{chunk} * kNkv * kD), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);

  printf("one-token appends to a CPU session (%u KV heads, d %u, f32, 16-token pages, index %s), %d each:\n",
         kNkv, kD, index ? "on" : "off", reps);
  for (uint32_t n : {1024u, 16384u, 65536u}) {
    ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F32);
    c.page_tokens = 16;
    c.index_min_tokens = index ? 1024 : 0xffffffffu;
    c.index_regrow_factor = 1000.f;  // no retraining inside the timed appends
    ssa_session* s = nullptr;
    check(ssa_session_create(rt, &c, &s), "session");
    for (uint32_t t = 0; t < n; t += chunk)
      check(ssa_session_append(s, 0, k.data(), v.data(), std::min(chunk, n - t)), "fill");
    std::vector<double> us(reps);
    for (int r = 0; r < reps; ++r) {
      const size_t at = size_t{static_cast<uint32_t>(r) % chunk} * kNkv * kD;
      const double t0 = now_us();
      check(ssa_session_append(s, 0, k.data() + at, v.data() + at, 1), "append");
      us[r] = now_us() - t0;
    }
    std::sort(us.begin(), us.end());
    printf("  layer of %6u tokens (%5u pages): median %7.2f us, p90 %7.2f us\n", n, n / 16, us[reps / 2],
           us[reps * 9 / 10]);
    ssa_session_destroy(s);
  }
  ssa_runtime_destroy(rt);
  return 0;
}
