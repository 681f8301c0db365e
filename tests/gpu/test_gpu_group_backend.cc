// Group selection (ssa_decode_params.group_selection) on CUDA sessions through
// the public C API, against the CPU backend on the same data as the per-head
// methods are tested (test_gpu_backend.cc, test_gpu_quality.cc): the same
// selection counts (heavy rows, draws, scores computed), the error distribution
// on the structured context, budget >= N and a group budget over every candidate
// equal to DENSE, determinism, decode_batch, CUDA graph capture, and the refusal
// of an error target with group selection.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <math.h>

#include <algorithm>
#include <string>
#include <vector>

#include "select/selection.h"
#include "support/gpu_layer.h"
#include "support/gpu_sessions.h"
#include "support/reference_attention.h"
#include "support/sample_statistics.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"
#include "support/structured_reference.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

const char* proposal(uint32_t g) { return g == SSA_GROUP_MIXTURE ? "mixture" : "mean_query"; }

ssa_decode_params group_params(ssa_method m, uint32_t budget, uint32_t group, uint64_t step = 0) {
  ssa_decode_params p = params(m, budget, step);
  p.group_selection = group;
  return p;
}

using ssa_test::ks_statistic;
using ssa_test::mean;
using ssa_test::std_error;

TEST_CASE("gpu backend: group selection against the CPU backend (counts, error distribution)") {
  SSA_GPU_TEST_OR_SKIP();
  using namespace ssa_test;
  const uint32_t d = 64, nq = 8, nkv = 2, G = nq / nkv;
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

  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    auto decode_params = [&](ssa_method m, uint64_t step) {
      ssa_decode_params p = ssa_test::params(m, 0, 50.0f);
      p.n_sink = p.n_local = 64;
      p.step = step;
      p.group_selection = group;
      return p;
    };
    // The counts that do not depend on the random draws or on the codebooks:
    // the CPU's, exactly.
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                         SSA_METHOD_SSA_ADAPTIVE}) {
      ssa_decode_stats a, b;
      ssa_decode_stats_init(&a);
      ssa_decode_stats_init(&b);
      const ssa_decode_params p = decode_params(m, 3);
      run_decode(sc.get(), 0, ctx.q, SSA_DTYPE_F16, p, &a);
      run_decode(sg.get(), 0, ctx.q, SSA_DTYPE_F16, p, &b);
      INFO(proposal(group), " method ", m, ": CPU heavy ", a.heavy_tokens, " draws ", a.draws, " unique ",
           a.unique_samples, " read ", a.tokens_read, " scored ", a.scored_tokens, "; GPU heavy ", b.heavy_tokens,
           " draws ", b.draws, " unique ", b.unique_samples, " read ", b.tokens_read, " scored ", b.scored_tokens);
      CHECK(b.context_tokens == a.context_tokens);
      CHECK(b.scored_tokens == a.scored_tokens);
      if (m != SSA_METHOD_SSA_ADAPTIVE) {
        CHECK(b.heavy_tokens == a.heavy_tokens);
        CHECK(b.draws == a.draws);
      } else {
        // Water-filling over proposals from different codebooks: close, not equal.
        CHECK(fabs(double(b.heavy_tokens) - double(a.heavy_tokens)) <= 0.2 * a.heavy_tokens + G * nq);
        CHECK(b.heavy_tokens + b.draws == a.heavy_tokens + a.draws);
      }
      // Each head reads the sink and local rows and all of its group's rows.
      CHECK(b.tokens_read == nq * uint64_t{128} + b.heavy_tokens + b.unique_samples);
      CHECK(b.unique_samples <= b.draws);
      if (m != SSA_METHOD_PQ_TOPK) CHECK(b.unique_samples > 0);
    }

    const int steps = 48;
    auto errors = [&](ssa_session* s, ssa_method m) {
      std::vector<double> e;
      for (int step = 0; step < (m == SSA_METHOD_PQ_TOPK ? 1 : steps); ++step) {
        const auto out = run_decode(s, 0, ctx.q, SSA_DTYPE_F16, decode_params(m, step));
        for (uint32_t h = 0; h < nq; ++h) {
          std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
          e.push_back(rel_l2(got.data(), ref[h].data(), d));
        }
      }
      return e;
    };
    {
      const auto ec = errors(sc.get(), SSA_METHOD_PQ_TOPK), eg = errors(sg.get(), SSA_METHOD_PQ_TOPK);
      MESSAGE(proposal(group), " PQ_TOPK mean error: CPU ", mean(ec), ", GPU ", mean(eg));
      CHECK(fabs(mean(eg) - mean(ec)) < 0.1 * mean(ec));
    }
    for (ssa_method m : {SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      const auto ec = errors(sc.get(), m), eg = errors(sg.get(), m);
      const double ks = ks_statistic(ec, eg);
      const double crit = 1.95 * sqrt(double(ec.size() + eg.size()) / (double(ec.size()) * eg.size()));
      const double se = sqrt(std_error(ec) * std_error(ec) + std_error(eg) * std_error(eg));
      MESSAGE(proposal(group), " method ", m, ": mean error CPU ", mean(ec), ", GPU ", mean(eg),
              " (se of difference ", se, "), KS ", ks, " (critical ", crit, ")");
      CHECK(fabs(mean(eg) - mean(ec)) < 4 * se + 0.02 * mean(ec));
      CHECK(ks < crit);
    }
  }
}

TEST_CASE("gpu backend: group selection is dense at full budget, deterministic, and batches and captures") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(9000, 21);
  ssa_session* sd = session(gpu, 0);  // device pointers
  fill(sd, d, true);
  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_session* sc = session(cpu, 0);
  fill(sc, d, false);
  const uint32_t G = kNq / kNkv;
  const auto dense = decode(sd, d, params(SSA_METHOD_DENSE, 0), true);
  const auto dense_cpu = decode(sc, d, params(SSA_METHOD_DENSE, 0), false);
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    for (ssa_method m : {SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                         SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      INFO(proposal(group), " method ", m);
      // Budget >= N, and a budget whose group share G k' covers the 8744
      // candidates (k' = 2500 - 256 per head) where one head's does not: DENSE.
      CHECK(rel(decode(sd, d, group_params(m, d.n + 10, group), true), dense) < 1e-6);
      ssa_decode_stats full;
      ssa_decode_stats_init(&full);
      CHECK(rel(decode(sd, d, group_params(m, 2500, group), true, &full), dense) < 1e-6);
      CHECK(full.tokens_read == uint64_t{d.n} * kNq);
      CHECK(full.heavy_tokens == uint64_t{d.n - 256} * kNq);
    }
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                         SSA_METHOD_SSA_ADAPTIVE}) {
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const uint32_t k = 600;
      const uint64_t kg = uint64_t{G} * (k - 256);
      const auto out = decode(sd, d, group_params(m, k, group, 3), true, &st);
      INFO(proposal(group), " method ", m, " rel err vs dense ", rel(out, dense), " read ", st.tokens_read,
           " heavy ", st.heavy_tokens, " draws ", st.draws, " unique ", st.unique_samples);
      // Close to dense as the CPU backend's group selection is on the same data:
      // mean error over 8 steps within 1.5x of the CPU's (the distributions are
      // compared more finely in the test above).
      double gpu_err = 0, cpu_err = 0;
      for (uint64_t step = 10; step < 18; ++step) {
        gpu_err += rel(decode(sd, d, group_params(m, k, group, step), true), dense) / 8;
        cpu_err += rel(decode(sc, d, group_params(m, k, group, step), false), dense_cpu) / 8;
      }
      INFO("mean error over 8 steps: gpu ", gpu_err, " cpu ", cpu_err);
      CHECK(gpu_err < 1.5 * cpu_err + 0.01);
      CHECK(st.context_tokens == d.n);
      CHECK(st.tokens_read <= (256 + kg) * kNq);
      CHECK(st.scored_tokens == uint64_t{d.n - 256} * (group == SSA_GROUP_MIXTURE ? kNq : kNkv));
      if (m == SSA_METHOD_PQ_TOPK) CHECK(st.heavy_tokens == kg * kNq);
      if (m == SSA_METHOD_SSA) {
        const uint64_t h = fixed_heavy_count(SSA_METHOD_SSA, kg, 0.4f);
        CHECK(st.heavy_tokens == h * kNq);
        CHECK(st.draws == (kg - h) * kNq);
      }
      // Same step: bitwise the same; another step: different samples.
      CHECK(decode(sd, d, group_params(m, k, group, 3), true) == out);
      if (m != SSA_METHOD_PQ_TOPK) CHECK(decode(sd, d, group_params(m, k, group, 4), true) != out);
      // Not the per-head selection (the rows differ).
      CHECK(decode(sd, d, params(m, k, 3), true) != out);
    }
  }
  ssa_session_destroy(sc);
  ssa_runtime_destroy(cpu);
  ssa_session_destroy(sd);

  // decode_batch over sessions of different lengths equals single decodes.
  const uint32_t lens[3] = {5000, 700, 12000};
  std::vector<Data> data;
  std::vector<ssa_session*> ss;
  for (int i = 0; i < 3; ++i) {
    data.push_back(make_data(lens[i], 100 + i));
    ss.push_back(session(gpu, SSA_SESSION_HOST_POINTERS));
    fill(ss.back(), data.back(), false);
  }
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA_ADAPTIVE}) {
      const ssa_decode_params p = group_params(m, 400, group, 9);
      std::vector<std::vector<uint16_t>> outs(3, std::vector<uint16_t>(kNq * kD, 0xffff));
      std::vector<ssa_decode_item> items(3);
      for (int i = 0; i < 3; ++i) items[i] = ssa_decode_item{ss[i], data[i].q.data(), outs[i].data()};
      REQUIRE(ssa_decode_batch(items.data(), 3, 0, &p) == SSA_OK);
      for (int i = 0; i < 3; ++i) {
        INFO(proposal(group), " method ", m, " item ", i);
        CHECK(rel(outs[i], decode(ss[i], data[i], p, false)) < 2e-3);
      }
    }
  }
  for (auto* s : ss) ssa_session_destroy(s);

  // Captured into a CUDA graph and replayed: the same output.
  ssa_session* s = session(gpu, 0);
  const Data dg = make_data(6000, 77);
  fill(s, dg, true);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  DevBuf<uint16_t> q(dg.q.size()), out(kNq * kD);
  q.upload(dg.q);
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    ssa_decode_params p = group_params(SSA_METHOD_SSA, 700, group, 11);
    p.stream = stream;
    REQUIRE(ssa_decode(s, 0, q.p, out.p, &p, nullptr) == SSA_OK);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const auto want = out.download(out.n);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    const ssa_status captured = ssa_decode(s, 0, q.p, out.p, &p, nullptr);
    const std::string msg = ssa_last_error_message();
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    INFO(proposal(group), ": ", msg);
    REQUIRE(captured == SSA_OK);
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    for (int rep = 0; rep < 2; ++rep) {
      REQUIRE(cudaMemsetAsync(out.p, 0xff, out.n * 2, stream) == cudaSuccess);
      REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      CHECK(out.download(out.n) == want);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);

  // An error target with group selection is refused; nothing is written.
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    ssa_decode_params p = group_params(SSA_METHOD_SSA, 0, group);
    p.target_error = 0.1f;
    const std::vector<uint16_t> poison(kNq * kD, 0x7777);
    out.upload(poison);
    CHECK(ssa_decode(s, 0, q.p, out.p, &p, nullptr) == SSA_ERR_UNSUPPORTED);
    const std::string msg = ssa_last_error_message();
    INFO(proposal(group), ": ", msg);
    CHECK(msg.find("target_error") != std::string::npos);
    CHECK(out.download(out.n) == poison);
  }
  ssa_session_destroy(s);
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
