// Fidelity on a structured synthetic context (attention sink, recency, clustered
// keys with topic-correlated values, topic bursts): at 50x sparsity SSA's error
// against exact attention must be well below PQ top-k's and the uniform hybrid's.
#include <doctest/doctest.h>

#include <math.h>

#include <map>
#include <vector>

#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"
#include "support/structured_reference.h"

using namespace ssa_test;

TEST_CASE("structured context at 50x: SSA error well below PQ_TOPK and HYBRID_UNIFORM") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 32768;
  const auto ctx = make_structured_context(n, nkv, nq, d);
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F16));
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);

  const auto ref = exact_outputs(ctx, SSA_DTYPE_F16);
  std::map<ssa_method, double> err;
  const int steps = 8;
  for (ssa_method m : {SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                       SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    double sum = 0.0;
    for (int step = 0; step < steps; ++step) {
      auto p = params(m, 0, 50.0f);
      p.n_sink = p.n_local = 64;
      p.step = step;
      const auto out = run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p);
      for (uint32_t h = 0; h < nq; ++h) {
        std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
        sum += rel_l2(got.data(), ref[h].data(), d);
      }
    }
    err[m] = sum / (steps * nq);
  }
  MESSAGE("mean relative L2 error at 50x (n = 32768, d = 64, sink/local 64/64): oracle top-k "
          << err[SSA_METHOD_ORACLE_TOPK] << ", PQ top-k " << err[SSA_METHOD_PQ_TOPK]
          << ", hybrid uniform " << err[SSA_METHOD_HYBRID_UNIFORM] << ", sampling "
          << err[SSA_METHOD_SAMPLING] << ", SSA h=0.4 " << err[SSA_METHOD_SSA] << ", SSA adaptive "
          << err[SSA_METHOD_SSA_ADAPTIVE]);
  CHECK(err[SSA_METHOD_SSA] < 0.7 * err[SSA_METHOD_PQ_TOPK]);
  CHECK(err[SSA_METHOD_SSA] < 0.7 * err[SSA_METHOD_HYBRID_UNIFORM]);
  CHECK(err[SSA_METHOD_SSA_ADAPTIVE] < err[SSA_METHOD_PQ_TOPK]);
}
