// The CUDA backend's estimator against the CPU backend's on the structured
// context (sink, recency, topic clusters, bursts) at 50x: the same data in a
// session of each backend, many RNG steps per method, and the distributions of
// per-head relative error against float64 exact attention compared. Sampling
// methods draw different random numbers on the two backends (same Philox keys,
// different draw order), so their errors are compared as distributions: equal
// means within a few standard errors and a two-sample Kolmogorov-Smirnov test.
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
#include <map>
#include <vector>

#include "support/gpu_layer.h"
#include "support/reference_attention.h"
#include "support/sample_statistics.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"
#include "support/structured_reference.h"

namespace ssa::gputest {
namespace {

using ssa_test::ks_statistic;
using ssa_test::mean;
using ssa_test::std_error;

TEST_CASE("gpu SSA error distribution on the structured context matches the CPU backend's") {
  SSA_GPU_TEST_OR_SKIP();
  using namespace ssa_test;
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 32768;
  const auto ctx = make_structured_context(n, nkv, nq, d);
  const auto ref = exact_outputs(ctx, SSA_DTYPE_F16);

  RuntimePtr cpu = make_runtime(2);
  ssa_runtime_options o;
  ssa_runtime_options_init(&o);
  o.backend = SSA_BACKEND_CUDA;
  o.seed = 1234;
  ssa_runtime* gpu_raw = nullptr;
  REQUIRE(ssa_runtime_create(&o, &gpu_raw) == SSA_OK);
  RuntimePtr gpu(gpu_raw);
  ssa_session_config c = make_config(1, nq, nkv, d, SSA_DTYPE_F16);
  c.flags = SSA_SESSION_HOST_POINTERS;
  SessionPtr sc = make_session(cpu.get(), c), sg = make_session(gpu.get(), c);
  append_f32(sc.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);
  append_f32(sg.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);

  const int steps = 48;
  auto errors = [&](ssa_session* s, ssa_method m) {
    std::vector<double> e;
    for (int step = 0; step < (m == SSA_METHOD_PQ_TOPK ? 1 : steps); ++step) {
      ssa_decode_params p = ssa_test::params(m, 0, 50.0f);
      p.n_sink = p.n_local = 64;
      p.step = step;
      const auto out = run_decode(s, 0, ctx.q, SSA_DTYPE_F16, p);
      for (uint32_t h = 0; h < nq; ++h) {
        std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
        e.push_back(rel_l2(got.data(), ref[h].data(), d));
      }
    }
    return e;
  };

  // PQ top-k is deterministic: its error depends on the codebooks only, which
  // both backends seed identically (the same k-means++ picks) and refine with Lloyd
  // iterations that differ in summation order.
  {
    const auto ec = errors(sc.get(), SSA_METHOD_PQ_TOPK), eg = errors(sg.get(), SSA_METHOD_PQ_TOPK);
    MESSAGE("PQ_TOPK mean error: CPU ", mean(ec), ", GPU ", mean(eg));
    CHECK(fabs(mean(eg) - mean(ec)) < 0.1 * mean(ec));
  }
  for (ssa_method m : {SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    const auto ec = errors(sc.get(), m), eg = errors(sg.get(), m);
    const double ks = ks_statistic(ec, eg);
    // Critical value of the two-sample KS test at alpha = 0.001.
    const double crit = 1.95 * sqrt(double(ec.size() + eg.size()) / (double(ec.size()) * eg.size()));
    const double se = sqrt(std_error(ec) * std_error(ec) + std_error(eg) * std_error(eg));
    MESSAGE("method ", m, ": mean error CPU ", mean(ec), ", GPU ", mean(eg), " (se of difference ",
            se, "), KS ", ks, " (critical ", crit, ")");
    CHECK(fabs(mean(eg) - mean(ec)) < 4 * se + 0.02 * mean(ec));
    CHECK(ks < crit);
  }
}

}  // namespace
}  // namespace ssa::gputest
