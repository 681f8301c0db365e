// Head slices of a decode step (run_decode_slices, lib/cuda/graph_step.h): the
// heads cut into slices of KV heads, each slice's attention on a second stream
// while the next slice selects. Every row keeps its stages and its workspace
// place, so a step gives the output of the whole step bitwise, for every slice
// count (uneven slices, one KV head each, more slices than heads), every proxy
// and method, eager and captured into a graph and replayed, one session or a
// batch; and the selection it reports is the same. Methods the slices do not
// serve (the adaptive heavy set, dense) run whole and still agree.
//
// Shape: 15 q heads over 5 KV heads (groups of 3), d 64, f16: slices of 2, 3, 5
// and 7 cut it unevenly.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "cuda/graph_step.h"
#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

constexpr uint32_t kSq = 15, kSkv = 5, kSd = 64;
constexpr size_t kSRow = size_t{kSkv} * kSd, kSOut = size_t{kSq} * kSd;

// Sets the slice count of every step for its lifetime, then gives the rule back.
struct SlicesSet {
  explicit SlicesSet(int n) { ssa::cuda::override_head_slices(n); }
  ~SlicesSet() { ssa::cuda::override_head_slices(0); }
};

struct Tokens {
  uint32_t prompt, steps;
  DevBuf<uint16_t> k, v, q;
  Tokens(uint32_t prompt_n, uint32_t steps_n, uint64_t seed)
      : prompt(prompt_n), steps(steps_n), k(size_t{prompt_n + steps_n} * kSRow), v(k.n), q(size_t{steps_n} * kSOut) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> hk(k.n), hv(v.n), hq(q.n);
    for (auto& x : hq) x = f32_to_f16(nd(rng));
    // Keys with a few strong directions per head, so that the proxies rank.
    for (size_t i = 0; i < hk.size(); ++i) hk[i] = f32_to_f16(nd(rng) * ((i / kSd) % 7 == 0 ? 2.5f : 1.0f));
    for (auto& x : hv) x = f32_to_f16(nd(rng));
    k.upload(hk);
    v.upload(hv);
    q.upload(hq);
  }
  const uint16_t* k_at(uint32_t t) const { return k.p + size_t{t} * kSRow; }
  const uint16_t* v_at(uint32_t t) const { return v.p + size_t{t} * kSRow; }
  const uint16_t* q_at(uint32_t i) const { return q.p + size_t{i} * kSOut; }
};

ssa_session* prompted(ssa_runtime* rt, const Tokens& T, ssa_proxy proxy) {
  ssa_session_config c = ssa_test::make_config(1, kSq, kSkv, kSd, SSA_DTYPE_F16);
  c.page_tokens = 128;
  c.index_min_tokens = 1024;
  c.index_regrow_factor = 0.0f;
  c.proxy = proxy;
  if (proxy == SSA_PROXY_PQ4) c.pq_centroids = 16;  // 4-bit codes
  ssa_session* s = nullptr;
  REQUIRE(ssa_session_create(rt, &c, &s) == SSA_OK);
  REQUIRE(ssa_session_append(s, 0, T.k_at(0), T.v_at(0), T.prompt) == SSA_OK);
  return s;
}

ssa_decode_params step_params(ssa_method m, cudaStream_t st) {
  ssa_decode_params p = ssa_test::params(m, 0, 20.0f);
  p.n_sink = 16;
  p.n_local = 16;
  p.step = 77;
  p.stream = st;
  return p;
}

struct Run {
  std::vector<uint16_t> out;      // every step's output, in step order
  std::vector<uint64_t> read;     // tokens_read of the steps with stats
  std::vector<double> residual;   // their residual proxy mass
};

// `sessions` sessions stepped together (one batch) for T.steps steps: the first
// half eagerly (every third with stats), the second half captured once and replayed.
Run stepped(ssa_runtime* rt, const Tokens& T, ssa_proxy proxy, const ssa_decode_params& p, uint32_t sessions) {
  cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  std::vector<ssa_session*> s(sessions);
  for (auto& x : s) x = prompted(rt, T, proxy);
  for (auto* x : s) REQUIRE(ssa_session_reserve(x, T.steps) == SSA_OK);
  DevBuf<uint16_t> outs(size_t{T.steps} * sessions * kSOut);
  Run r;
  auto items_at = [&](uint32_t i, const void* k, const void* v, const void* q, uint16_t* out) {
    std::vector<ssa_decode_step_item> items(sessions);
    for (uint32_t j = 0; j < sessions; ++j) items[j] = {s[j], k, v, q, out + size_t{j} * kSOut};
    return items;
  };
  const uint32_t eager = T.steps / 2;
  for (uint32_t i = 0; i < eager; ++i) {
    const uint32_t t = T.prompt + i;
    ssa_decode_stats stats;
    ssa_decode_stats_init(&stats);
    const bool with_stats = i % 3 == 0;
    auto items = items_at(i, T.k_at(t), T.v_at(t), T.q_at(i), outs.p + size_t{i} * sessions * kSOut);
    const ssa_status rc = ssa_decode_step_batch(items.data(), items.size(), 0, &p, with_stats ? &stats : nullptr);
    INFO("step ", i, ": ", ssa_last_error_message());
    REQUIRE(rc == SSA_OK);
    if (with_stats) {
      r.read.push_back(stats.tokens_read);
      r.residual.push_back(stats.residual_proxy_mass);
    }
  }
  // The rest through one captured graph over static buffers, refilled per replay.
  DevBuf<uint16_t> k(kSRow), v(kSRow), q(kSOut), out(size_t{sessions} * kSOut);
  cudaGraph_t graph;
  REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess);
  auto items = items_at(0, k.p, v.p, q.p, out.p);
  const ssa_status captured = ssa_decode_step_batch(items.data(), items.size(), 0, &p, nullptr);
  const std::string message = ssa_last_error_message();
  REQUIRE(cudaStreamEndCapture(st, &graph) == cudaSuccess);
  INFO(message);
  REQUIRE(captured == SSA_OK);
  cudaGraphExec_t exec;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (uint32_t i = eager; i < T.steps; ++i) {
    const uint32_t t = T.prompt + i;
    REQUIRE(cudaMemcpyAsync(k.p, T.k_at(t), kSRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(v.p, T.v_at(t), kSRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(q.p, T.q_at(i), kSOut * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(out.p, 0xff, out.n * 2, st) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, st) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(outs.p + size_t{i} * sessions * kSOut, out.p, out.n * 2, cudaMemcpyDeviceToDevice, st) ==
            cudaSuccess);
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (auto* x : s) {
    uint64_t dropped = 9;
    REQUIRE(ssa_session_sync(x, &dropped) == SSA_OK);
    CHECK(dropped == 0);
    CHECK(ssa_session_layer_length(x, 0) == T.prompt + T.steps);
    ssa_session_destroy(x);
  }
  r.out = outs.download(outs.n);
  return r;
}

TEST_CASE("gpu head slices: a sliced step gives the whole step's output bitwise, eager and replayed") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* rt = runtime(SSA_BACKEND_CUDA);
  const Tokens T(3000, 8, 5);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  for (ssa_proxy proxy : {SSA_PROXY_PQ, SSA_PROXY_PQ4, SSA_PROXY_QPQ}) {
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                         SSA_METHOD_SAMPLING, SSA_METHOD_SSA_ADAPTIVE, SSA_METHOD_DENSE}) {
      INFO("proxy ", proxy, ", method ", m);
      const ssa_decode_params p = step_params(m, st);
      Run whole;
      {
        SlicesSet one(1);
        whole = stepped(rt, T, proxy, p, 1);
      }
      // The steps differ from one another (a constant output would pass anything).
      CHECK(std::vector<uint16_t>(whole.out.begin(), whole.out.begin() + kSOut) !=
            std::vector<uint16_t>(whole.out.begin() + kSOut, whole.out.begin() + 2 * kSOut));
      for (int slices : {2, 3, 5, 7}) {
        INFO(slices, " slices");
        SlicesSet set(slices);
        const Run cut = stepped(rt, T, proxy, p, 1);
        CHECK(cut.out == whole.out);
        CHECK(cut.read == whole.read);
        CHECK(cut.residual == whole.residual);
      }
    }
  }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(rt);
}

TEST_CASE("gpu head slices: a batch of sessions sliced equals it whole, and each session alone") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* rt = runtime(SSA_BACKEND_CUDA);
  const Tokens T(2500, 6, 9);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  const ssa_decode_params p = step_params(SSA_METHOD_SSA, st);
  Run whole, alone;
  {
    SlicesSet one(1);
    whole = stepped(rt, T, SSA_PROXY_PQ, p, 3);
    alone = stepped(rt, T, SSA_PROXY_PQ, p, 1);
  }
  SlicesSet three(3);
  const Run cut = stepped(rt, T, SSA_PROXY_PQ, p, 3);
  CHECK(cut.out == whole.out);
  CHECK(cut.read == whole.read);
  // The three sessions hold the same tokens: each row of the batch is the lone session's step.
  for (uint32_t i = 0; i < T.steps; ++i)
    for (uint32_t j = 0; j < 3; ++j) {
      INFO("step ", i, ", session ", j);
      CHECK(std::vector<uint16_t>(cut.out.begin() + (size_t{i} * 3 + j) * kSOut,
                                  cut.out.begin() + (size_t{i} * 3 + j + 1) * kSOut) ==
            std::vector<uint16_t>(alone.out.begin() + size_t{i} * kSOut, alone.out.begin() + size_t{i + 1} * kSOut));
    }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(rt);
}

}  // namespace
}  // namespace ssa::gputest
