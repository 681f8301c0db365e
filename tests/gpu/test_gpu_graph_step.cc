// Decode steps captured into CUDA graphs (ssa_decode_step after
// ssa_session_reserve): a step captured once and replayed for every token must
// give what the same step run eagerly gives, bitwise, while the session grows on
// the device; and the same selection as the plain loop (ssa_session_append_async
// then ssa_decode at step p.step + position), its output up to the attention's
// rounding. A tiered session's steps (pages on the host, a cache of host pages
// renewed with each reservation) equal the untiered session's, bitwise, and
// tiered sessions taking turns (reserve, steps, checkpoint) trade the budget:
// each turn's session reads its pages from the device, also when its turn was
// started ahead (ssa_session_prefetch) while another decoded. Then
// what a graph cannot do is refused at capture, replays after a
// reservation ended (truncate, update_index, destroy) do nothing and are
// counted, and the host's view after replays (lengths, a snapshot) is the
// session the steps built.
//
// The loop as a model runs it: static device buffers for the token's K, V, q and
// out that the graph was captured with, refilled before every replay.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_alloc.h"
#include "cuda/device_state.h"
#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

constexpr size_t kRow = size_t{kNkv} * kD;
constexpr size_t kOut = size_t{kNq} * kD;

// The token stream of a loop: K/V of every token (prompt then steps) and one
// random query per step, all on the device.
struct Loop {
  Data d;  // d.n tokens: the prompt's, then the steps'
  uint32_t prompt, steps;
  DevBuf<uint16_t> k, v, q;
  Loop(uint32_t prompt_n, uint32_t steps_n, uint64_t seed)
      : d(make_data(prompt_n + steps_n, seed)), prompt(prompt_n), steps(steps_n), k(d.k.size()), v(d.v.size()),
        q(size_t{steps_n} * kOut) {
    k.upload(d.k);
    v.upload(d.v);
    std::mt19937_64 rng(seed * 7 + 1);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> qs(q.n);
    for (auto& x : qs) x = f32_to_f16(nd(rng));
    q.upload(qs);
  }
  const uint16_t* k_at(uint32_t t) const { return k.p + size_t{t} * kRow; }
  const uint16_t* v_at(uint32_t t) const { return v.p + size_t{t} * kRow; }
  const uint16_t* q_at(uint32_t step) const { return q.p + size_t{step} * kOut; }
};

// A session holding the loop's prompt (indexed: 1024 tokens train it).
ssa_session* prompted(ssa_runtime* rt, const Loop& L, float regrow = 0.0f) {
  ssa_session* s = session(rt, 0, SSA_DTYPE_F16, regrow);
  REQUIRE(ssa_session_append(s, 0, L.k_at(0), L.v_at(0), L.prompt) == SSA_OK);
  return s;
}

// One call captured on a stream (nothing runs), with its status and message;
// the graph is instantiated when the call accepted the capture.
struct CapturedGraph {
  cudaGraphExec_t exec = nullptr;
  ssa_status status = SSA_OK;
  std::string message;

  template <typename Call>
  CapturedGraph(cudaStream_t st, Call&& call) {
    cudaGraph_t graph;
    REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess);
    status = call();
    message = ssa_last_error_message();
    REQUIRE(cudaStreamEndCapture(st, &graph) == cudaSuccess);
    if (status == SSA_OK) REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    cudaGraphDestroy(graph);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  void launch(cudaStream_t st) const { REQUIRE(cudaGraphLaunch(exec, st) == cudaSuccess); }
};

// The graph of one step of `s` over static buffers (captured, not run).
struct StepGraph {
  DevBuf<uint16_t> k{kRow}, v{kRow}, q{kOut}, out{kOut};
  CapturedGraph graph;

  StepGraph(ssa_session* s, const ssa_decode_params& p, cudaStream_t st)
      : graph(st, [&] { return ssa_decode_step(s, 0, k.p, v.p, q.p, out.p, &p, nullptr); }) {}
  // Token t of the loop (step `step`), its output into outs (device, kOut each).
  void replay(const Loop& L, uint32_t t, uint32_t step, uint16_t* outs, cudaStream_t st) {
    REQUIRE(cudaMemcpyAsync(k.p, L.k_at(t), kRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(v.p, L.v_at(t), kRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(q.p, L.q_at(step), kOut * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(out.p, 0xff, kOut * 2, st) == cudaSuccess);
    graph.launch(st);
    REQUIRE(cudaMemcpyAsync(outs, out.p, kOut * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
  }
};

off_t file_bytes(const std::string& path) {
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st.st_size;
}

std::vector<uint16_t> slice(const std::vector<uint16_t>& all, uint32_t i) {
  return std::vector<uint16_t>(all.begin() + size_t{i} * kOut, all.begin() + size_t{i + 1} * kOut);
}

// A CUDA runtime with a 2 MiB device budget and 512 KiB of host-page cache: at
// 1 KiB of K/V per token and 128 KiB pages, a 3000-token prompt takes 24 pages,
// of which 12 fit the resident account; 4 pages of cache.
ssa_runtime* tiered_runtime() {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = uint64_t{2} << 20;
  o.host_cache_bytes = uint64_t{512} << 10;
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

ssa_decode_params step_params(ssa_method m, cudaStream_t st) {
  // A budget from sparsity: k, k' and |H| change with the length, on the device.
  ssa_decode_params p = ssa_test::params(m, 0, 20.0f);
  p.n_sink = 16;  // 150..250 tokens of budget at 3000..5000: room for a heavy set and draws
  p.n_local = 16;
  p.step = 500;
  p.stream = st;
  return p;
}

TEST_CASE("gpu graph step: 1000 replayed steps equal the eager steps bitwise and the plain loop's selection") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  // 3000 prompt tokens (the last page partly filled: 3000 % 128 != 0).
  const Loop L(3000, 1000, 41);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_DENSE, SSA_METHOD_SSA_ADAPTIVE}) {
    INFO("method ", m);
    const ssa_decode_params p = step_params(m, st);
    ssa_session* eager = prompted(gpu, L);
    ssa_session* graphed = prompted(gpu, L);
    ssa_session* plain = prompted(gpu, L);
    REQUIRE(ssa_session_reserve(eager, L.steps) == SSA_OK);
    REQUIRE(ssa_session_reserve(graphed, L.steps) == SSA_OK);
    StepGraph g(graphed, p, st);
    INFO(g.graph.message);
    REQUIRE(g.graph.status == SSA_OK);
    CHECK(ssa_session_layer_length(graphed, 0) == L.prompt);  // capture ran nothing
    DevBuf<uint16_t> out_eager(size_t{L.steps} * kOut), out_graph(size_t{L.steps} * kOut),
        out_plain(size_t{L.steps} * kOut);
    uint32_t selections_checked = 0;
    for (uint32_t i = 0; i < L.steps; ++i) {
      const uint32_t t = L.prompt + i;
      g.replay(L, t, i, out_graph.p + size_t{i} * kOut, st);
      // Every 25th step with stats (a wait), the others queued.
      const bool with_stats = i % 25 == 0;
      ssa_decode_stats se, sp;
      ssa_decode_stats_init(&se);
      ssa_decode_stats_init(&sp);
      const ssa_status r = ssa_decode_step(eager, 0, L.k_at(t), L.v_at(t), L.q_at(i), out_eager.p + size_t{i} * kOut,
                                           &p, with_stats ? &se : nullptr);
      INFO("step ", i, ": ", ssa_last_error_message());
      REQUIRE(r == SSA_OK);
      REQUIRE(ssa_session_append_async(plain, 0, L.k_at(t), L.v_at(t), 1, st) == SSA_OK);
      ssa_decode_params pp = p;
      pp.step = p.step + t;  // the step's RNG step: p.step + the token's position
      REQUIRE(ssa_decode(plain, 0, L.q_at(i), out_plain.p + size_t{i} * kOut, &pp, with_stats ? &sp : nullptr) ==
              SSA_OK);
      if (with_stats) {
        // The same selection: every count of what was read, and the residual mass.
        CHECK(se.context_tokens == t + 1);
        CHECK(se.context_tokens == sp.context_tokens);
        CHECK(se.tokens_read == sp.tokens_read);
        CHECK(se.heavy_tokens == sp.heavy_tokens);
        CHECK(se.draws == sp.draws);
        CHECK(se.unique_samples == sp.unique_samples);
        CHECK(se.scored_tokens == sp.scored_tokens);
        CHECK(se.residual_proxy_mass == sp.residual_proxy_mass);
        ++selections_checked;
      }
    }
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(selections_checked == 40);
    const std::vector<uint16_t> ge = out_eager.download(out_eager.n), gg = out_graph.download(out_graph.n),
                                gp = out_plain.download(out_plain.n);
    uint32_t equal = 0;
    double worst = 0;
    for (uint32_t i = 0; i < L.steps; ++i) {
      if (slice(gg, i) == slice(ge, i)) ++equal;
      worst = std::max(worst, rel(slice(ge, i), slice(gp, i)));
    }
    CHECK(equal == L.steps);   // replays = eager steps, bitwise
    CHECK(worst < 2e-3);       // = the plain loop up to the attention's rounding
    // The host's view after the replays.
    uint64_t dropped = 99;
    REQUIRE(ssa_session_sync(graphed, &dropped) == SSA_OK);
    CHECK(dropped == 0);
    CHECK(ssa_session_layer_length(graphed, 0) == L.prompt + L.steps);
    CHECK(ssa_session_length(eager) == L.prompt);  // not committed yet: no call on it since
    // Plain decodes of all three sessions read the same tokens and codes.
    Data probe = L.d;
    const ssa_decode_params pd = params(m, 900, 3);
    const auto want = decode(plain, probe, pd, true);
    CHECK(decode(graphed, probe, pd, true) == want);
    CHECK(decode(eager, probe, pd, true) == want);
    CHECK(ssa_session_length(eager) == L.prompt + L.steps);
    // A snapshot saved after the replays loads and decodes the same.
    const std::string path = std::string(P_tmpdir) + "/ssa_graph_step_" + std::to_string(getpid()) + ".ssa";
    REQUIRE(ssa_session_save(graphed, path.c_str()) == SSA_OK);
    ssa_session* loaded = nullptr;
    REQUIRE(ssa_session_load(gpu, path.c_str(), 0, &loaded) == SSA_OK);
    CHECK(ssa_session_length(loaded) == L.prompt + L.steps);
    CHECK(decode(loaded, probe, pd, true) == want);
    std::remove(path.c_str());
    // The save ended the reservation: the graph's replays now do nothing.
    DevBuf<uint16_t> none(kOut);
    g.replay(L, 0, 0, none.p, st);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(none.download(kOut) == std::vector<uint16_t>(kOut, 0xffff));
    REQUIRE(ssa_session_sync(graphed, &dropped) == SSA_OK);
    CHECK(dropped == 1);
    CHECK(ssa_session_layer_length(graphed, 0) == L.prompt + L.steps);
    ssa_session_destroy(loaded);
    ssa_session_destroy(eager);
    ssa_session_destroy(graphed);
    ssa_session_destroy(plain);
  }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu graph step: a batch over sessions of different lengths, captured once, replays as it runs eagerly") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const uint32_t prompts[] = {1500, 4100, 2222};
  const uint32_t steps = 200;
  std::vector<Loop> loops;
  for (uint32_t i = 0; i < 3; ++i) loops.emplace_back(prompts[i], steps, 90 + i);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  const ssa_decode_params p = step_params(SSA_METHOD_SSA, st);
  std::vector<ssa_session*> graphed, eager, single;
  for (const Loop& L : loops) {
    graphed.push_back(prompted(gpu, L));
    eager.push_back(prompted(gpu, L));
    single.push_back(prompted(gpu, L));
    REQUIRE(ssa_session_reserve(graphed.back(), steps) == SSA_OK);
    REQUIRE(ssa_session_reserve(eager.back(), steps) == SSA_OK);
    REQUIRE(ssa_session_reserve(single.back(), steps) == SSA_OK);
  }
  // Static buffers of the captured batch.
  std::vector<DevBuf<uint16_t>> kb, vb, qb, ob;
  std::vector<ssa_decode_step_item> items;
  for (uint32_t i = 0; i < 3; ++i) {
    kb.emplace_back(kRow);
    vb.emplace_back(kRow);
    qb.emplace_back(kOut);
    ob.emplace_back(kOut);
  }
  for (uint32_t i = 0; i < 3; ++i) items.push_back({graphed[i], kb[i].p, vb[i].p, qb[i].p, ob[i].p});
  const CapturedGraph batch(st, [&] { return ssa_decode_step_batch(items.data(), items.size(), 0, &p, nullptr); });
  INFO(batch.message);
  REQUIRE(batch.status == SSA_OK);
  DevBuf<uint16_t> out_g(3 * size_t{steps} * kOut), out_e(out_g.n), out_s(out_g.n);
  for (uint32_t j = 0; j < steps; ++j) {
    std::vector<ssa_decode_step_item> now;
    for (uint32_t i = 0; i < 3; ++i) {
      const Loop& L = loops[i];
      const uint32_t t = L.prompt + j;
      REQUIRE(cudaMemcpyAsync(kb[i].p, L.k_at(t), kRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
      REQUIRE(cudaMemcpyAsync(vb[i].p, L.v_at(t), kRow * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
      REQUIRE(cudaMemcpyAsync(qb[i].p, L.q_at(j), kOut * 2, cudaMemcpyDeviceToDevice, st) == cudaSuccess);
      now.push_back({eager[i], L.k_at(t), L.v_at(t), L.q_at(j), out_e.p + (size_t{j} * 3 + i) * kOut});
    }
    batch.launch(st);
    for (uint32_t i = 0; i < 3; ++i) {
      REQUIRE(cudaMemcpyAsync(out_g.p + (size_t{j} * 3 + i) * kOut, ob[i].p, kOut * 2, cudaMemcpyDeviceToDevice, st) ==
              cudaSuccess);
    }
    const bool with_stats = j % 20 == 0;
    ssa_decode_stats sb, s1;
    ssa_decode_stats_init(&sb);
    REQUIRE(ssa_decode_step_batch(now.data(), now.size(), 0, &p, with_stats ? &sb : nullptr) == SSA_OK);
    uint64_t read = 0, draws = 0;
    for (uint32_t i = 0; i < 3; ++i) {
      ssa_decode_stats_init(&s1);
      const Loop& L = loops[i];
      const uint32_t t = L.prompt + j;
      REQUIRE(ssa_decode_step(single[i], 0, L.k_at(t), L.v_at(t), L.q_at(j), out_s.p + (size_t{j} * 3 + i) * kOut, &p,
                              with_stats ? &s1 : nullptr) == SSA_OK);
      read += s1.tokens_read;
      draws += s1.draws;
    }
    if (with_stats) {  // each item selects as it does alone
      CHECK(sb.tokens_read == read);
      CHECK(sb.draws == draws);
    }
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  const auto g = out_g.download(out_g.n), e = out_e.download(out_e.n), s1 = out_s.download(out_s.n);
  CHECK(g == e);  // replays = the eager batch, bitwise
  double worst = 0;
  for (uint32_t i = 0; i < 3 * steps; ++i) worst = std::max(worst, rel(slice(e, i), slice(s1, i)));
  CHECK(worst < 2e-3);  // = single steps up to the attention's rounding
  for (uint32_t i = 0; i < 3; ++i) {
    REQUIRE(ssa_session_sync(graphed[i], nullptr) == SSA_OK);
    CHECK(ssa_session_layer_length(graphed[i], 0) == prompts[i] + steps);
  }
  for (auto* s : graphed) ssa_session_destroy(s);
  for (auto* s : eager) ssa_session_destroy(s);
  for (auto* s : single) ssa_session_destroy(s);
  cudaStreamDestroy(st);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu graph step: a tiered session's steps read host pages and equal the untiered session's, bitwise") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* t_graph = tiered_runtime();
  ssa_runtime* t_eager = tiered_runtime();
  const Loop L(3000, 240, 17);
  constexpr uint32_t kChunk = 40;  // tokens per reservation: renewed six times (pages move, the cache learns)
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_DENSE}) {
    INFO("method ", m);
    const ssa_decode_params p = step_params(m, st);
    ssa_session* ref = prompted(gpu, L);         // untiered, eager steps
    ssa_session* graphed = prompted(t_graph, L);  // tiered, a graph per reservation, replayed
    ssa_session* eager = prompted(t_eager, L);    // tiered, eager steps, some with stats
    DevBuf<uint16_t> out_ref(size_t{L.steps} * kOut), out_graph(out_ref.n), out_eager(out_ref.n);
    uint64_t from_host = 0, cache_hits = 0;
    uint32_t checked = 0;
    for (uint32_t i0 = 0; i0 < L.steps; i0 += kChunk) {
      REQUIRE(ssa_session_reserve(ref, kChunk) == SSA_OK);
      REQUIRE(ssa_session_reserve(graphed, kChunk) == SSA_OK);
      REQUIRE(ssa_session_reserve(eager, kChunk) == SSA_OK);
      StepGraph g(graphed, p, st);
      INFO(g.graph.message);
      REQUIRE(g.graph.status == SSA_OK);
      for (uint32_t i = i0; i < i0 + kChunk; ++i) {
        const uint32_t t = L.prompt + i;
        g.replay(L, t, i, out_graph.p + size_t{i} * kOut, st);
        const bool with_stats = i % 10 == 0;
        ssa_decode_stats sr, se;
        ssa_decode_stats_init(&sr);
        ssa_decode_stats_init(&se);
        ssa_status r = ssa_decode_step(ref, 0, L.k_at(t), L.v_at(t), L.q_at(i), out_ref.p + size_t{i} * kOut, &p,
                                       with_stats ? &sr : nullptr);
        INFO("step ", i, ": ", ssa_last_error_message());
        REQUIRE(r == SSA_OK);
        r = ssa_decode_step(eager, 0, L.k_at(t), L.v_at(t), L.q_at(i), out_eager.p + size_t{i} * kOut, &p,
                            with_stats ? &se : nullptr);
        REQUIRE(r == SSA_OK);
        if (with_stats) {  // the same selection; the rows of host pages counted by tier
          CHECK(se.tokens_read == sr.tokens_read);
          CHECK(se.draws == sr.draws);
          CHECK(se.heavy_tokens == sr.heavy_tokens);
          CHECK(sr.rows_from_host + sr.host_cache_hits == 0);
          CHECK(se.rows_from_host + se.host_cache_hits <= se.tokens_read);
          from_host += se.rows_from_host;
          cache_hits += se.host_cache_hits;
          ++checked;
        }
      }
    }
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(checked == L.steps / 10);
    CHECK(from_host > 0);  // the steps read host pages in place
    // The cache admits the host pages that sparse steps read, at each renewal;
    // a dense step marks no page.
    if (m != SSA_METHOD_DENSE) CHECK(cache_hits > 0);
    const auto gr = out_ref.download(out_ref.n), gg = out_graph.download(out_graph.n),
               ge = out_eager.download(out_eager.n);
    uint32_t equal_graph = 0, equal_eager = 0;
    for (uint32_t i = 0; i < L.steps; ++i) {
      equal_graph += slice(gg, i) == slice(gr, i);
      equal_eager += slice(ge, i) == slice(gr, i);
    }
    CHECK(equal_graph == L.steps);
    CHECK(equal_eager == L.steps);
    // The host's view after the steps: the same session wherever its pages are.
    for (ssa_session* s : {ref, graphed, eager}) {
      REQUIRE(ssa_session_sync(s, nullptr) == SSA_OK);
      CHECK(ssa_session_layer_length(s, 0) == L.prompt + L.steps);
    }
    Data probe = L.d;
    const ssa_decode_params pd = params(m, 900, 3);
    const auto want = decode(ref, probe, pd, true);
    CHECK(decode(graphed, probe, pd, true) == want);
    CHECK(decode(eager, probe, pd, true) == want);
    // An append ends the reservation; the tiered session takes it as the untiered one.
    REQUIRE(ssa_session_append(graphed, 0, L.k_at(0), L.v_at(0), 300) == SSA_OK);
    REQUIRE(ssa_session_append(ref, 0, L.k_at(0), L.v_at(0), 300) == SSA_OK);
    CHECK(decode(graphed, probe, pd, true) == decode(ref, probe, pd, true));
    ssa_session_destroy(ref);
    ssa_session_destroy(graphed);
    ssa_session_destroy(eager);
  }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(t_eager);
  ssa_runtime_destroy(t_graph);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu graph step: settling a tiered session after every step changes nothing its next reservation learns") {
  SSA_GPU_TEST_OR_SKIP();
  // What a reservation's steps read decides which host pages the next one
  // caches. A generate loop settles before every step (ssa.hf does): the
  // reads of all the reservation's steps must still be what is taken in, as
  // for a session settled only when its reservation ends.
  ssa_runtime* rt_a = tiered_runtime();
  ssa_runtime* rt_b = tiered_runtime();
  const Loop L(3000, 120, 29);
  constexpr uint32_t kChunk = 40;
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  const ssa_decode_params p = step_params(SSA_METHOD_SSA, st);
  ssa_session* settled = prompted(rt_a, L);  // ssa_session_sync after every step
  ssa_session* plain = prompted(rt_b, L);    // settled only when a reservation ends
  DevBuf<uint16_t> out_a(size_t{L.steps} * kOut), out_b(out_a.n);
  std::vector<uint64_t> hits_a, hits_b, host_a, host_b;
  for (uint32_t i0 = 0; i0 < L.steps; i0 += kChunk) {
    REQUIRE(ssa_session_reserve(settled, kChunk) == SSA_OK);
    REQUIRE(ssa_session_reserve(plain, kChunk) == SSA_OK);
    uint64_t ha = 0, hb = 0, ra = 0, rb = 0;
    for (uint32_t i = i0; i < i0 + kChunk; ++i) {
      const uint32_t t = L.prompt + i;
      ssa_decode_stats sa, sb;
      ssa_decode_stats_init(&sa);
      ssa_decode_stats_init(&sb);
      REQUIRE(ssa_decode_step(settled, 0, L.k_at(t), L.v_at(t), L.q_at(i), out_a.p + size_t{i} * kOut, &p, &sa) ==
              SSA_OK);
      REQUIRE(ssa_session_sync(settled, nullptr) == SSA_OK);
      REQUIRE(ssa_decode_step(plain, 0, L.k_at(t), L.v_at(t), L.q_at(i), out_b.p + size_t{i} * kOut, &p, &sb) ==
              SSA_OK);
      ha += sa.host_cache_hits;
      hb += sb.host_cache_hits;
      ra += sa.rows_from_host;
      rb += sb.rows_from_host;
    }
    hits_a.push_back(ha);
    hits_b.push_back(hb);
    host_a.push_back(ra);
    host_b.push_back(rb);
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  CHECK(out_a.download(out_a.n) == out_b.download(out_b.n));
  CHECK(hits_a == hits_b);
  CHECK(host_a == host_b);
  CHECK(hits_b.back() > 0);  // the later reservations read cached copies
  ssa_session_destroy(settled);
  ssa_session_destroy(plain);
  cudaStreamDestroy(st);
  ssa_runtime_destroy(rt_b);
  ssa_runtime_destroy(rt_a);
}

// A CUDA runtime for sessions taking turns, of 128 KiB pages (128 tokens of
// 1 KiB): `resident_pages` pages of budget beside 1 MiB of host-page cache. A
// 4000-token session takes 32 pages, 10 of them pinned (the first, the newest
// 1024 tokens).
ssa_runtime* turns_runtime(uint32_t resident_pages) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.host_cache_bytes = uint64_t{1} << 20;
  o.device_kv_budget = o.host_cache_bytes + uint64_t{resident_pages} * (128 << 10);
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

// Step `step` of `L` (layer `layer`) in a reference session and a tiered one,
// each writing its row of its output; returns the tiered step's stats.
ssa_decode_stats step_both(ssa_session* ref, ssa_session* tiered, uint32_t layer, const Loop& L, uint32_t step,
                           DevBuf<uint16_t>& out_ref, DevBuf<uint16_t>& out_tiered, const ssa_decode_params& p) {
  const uint32_t t = L.prompt + step;
  ssa_decode_stats se;
  ssa_decode_stats_init(&se);
  REQUIRE(ssa_decode_step(ref, layer, L.k_at(t), L.v_at(t), L.q_at(step), out_ref.p + size_t{step} * kOut, &p,
                          nullptr) == SSA_OK);
  REQUIRE(ssa_decode_step(tiered, layer, L.k_at(t), L.v_at(t), L.q_at(step), out_tiered.p + size_t{step} * kOut, &p,
                          &se) == SSA_OK);
  return se;
}

// What the cases of sessions taking turns share: a plain CUDA runtime for the
// references, a budgeted one (turns_runtime) for the tiered sessions, a stream
// and SSA step parameters on it. Built in the order the cases need them and
// destroyed in one place, once every session of the case is gone.
struct TurnsRig {
  explicit TurnsRig(uint32_t resident_pages)
      : gpu(runtime(SSA_BACKEND_CUDA)), rt(turns_runtime(resident_pages)), st(new_stream()),
        p(step_params(SSA_METHOD_SSA, st)) {}
  ~TurnsRig() {
    // A failed REQUIRE unwinds past the case's sessions, still alive: their
    // runtimes must outlive them (ssa_runtime_destroy), so everything is left.
    if (std::uncaught_exceptions() > 0) return;
    cudaStreamDestroy(st);
    ssa_runtime_destroy(rt);
    ssa_runtime_destroy(gpu);
  }
  TurnsRig(const TurnsRig&) = delete;
  TurnsRig& operator=(const TurnsRig&) = delete;

  static cudaStream_t new_stream() {
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    return s;
  }

  ssa_runtime* gpu;
  ssa_runtime* rt;
  cudaStream_t st;
  ssa_decode_params p;
};

TEST_CASE("gpu graph step: sessions taking turns trade the budget: the one reserving reads few host rows, bitwise") {
  SSA_GPU_TEST_OR_SKIP();
  CUDA_OK(cudaDeviceSynchronize());
  const uint64_t used0 = cuda::device_pool_bytes(true);
  // 64 resident pages hold one session whole beside the others' pinned pages,
  // not all three: the third filled starts with its pages on the host.
  const TurnsRig rig(64);
  const auto& [gpu, rt, st, p] = rig;
  constexpr int kSessions = 3;
  constexpr uint32_t kTurn = 24, kRounds = 4;
  std::vector<std::unique_ptr<Loop>> loops;
  const Loop rewrite(4000 + kTurn, 1, 97);
  std::vector<ssa_session*> ref, tiered;
  std::vector<std::unique_ptr<DevBuf<uint16_t>>> out_ref, out_tiered;
  std::vector<std::string> paths;
  for (int i = 0; i < kSessions; ++i) {
    loops.push_back(std::make_unique<Loop>(4000, kTurn * kRounds, 41 + i));
    ref.push_back(prompted(gpu, *loops[i]));
    tiered.push_back(prompted(rt, *loops[i]));
    paths.push_back(std::string(P_tmpdir) + "/ssa_gpu_trade_" + std::to_string(getpid()) + "_" + std::to_string(i));
    std::remove(paths.back().c_str());
    REQUIRE(ssa_session_save(tiered[i], paths.back().c_str()) == SSA_OK);  // checkpoints append to it
    out_ref.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{kTurn} * kRounds * kOut));
    out_tiered.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{kTurn} * kRounds * kOut));
  }
  {  // the last one filled reads most rows from the host before its first turn
    Data probe = loops[kSessions - 1]->d;
    ssa_decode_params pd = params(SSA_METHOD_SSA, 300, 3);
    ssa_decode_stats stats;
    ssa_decode_stats_init(&stats);
    decode(tiered[kSessions - 1], probe, pd, true, &stats);
    CHECK(stats.rows_from_host * 2 > stats.tokens_read);
  }
  uint64_t steps_checked = 0;
  for (uint32_t r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kSessions; ++i) {
      const Loop& L = *loops[i];
      // Device allocations of a reservation: the untiered one's are its tables;
      // the tiered one's add its tier tables, the move lists and the last page's
      // copy. The pages it brings in (about 22) take the blocks the others gave
      // up: the runtime's sessions share their page blocks (lib/cuda/device_pages.h).
      const uint64_t calls0 = cuda::device_alloc_calls_made();
      REQUIRE(ssa_session_reserve(ref[i], kTurn) == SSA_OK);
      const uint64_t calls1 = cuda::device_alloc_calls_made();
      REQUIRE(ssa_session_reserve(tiered[i], kTurn) == SSA_OK);
      const uint64_t ref_calls = calls1 - calls0, tiered_calls = cuda::device_alloc_calls_made() - calls1;
      MESSAGE("round ", r, " session ", i, ": device allocations of the reservation: ", tiered_calls, " (untiered ",
              ref_calls, ")");
      if (r >= 2) CHECK(tiered_calls <= ref_calls + 8);
      uint64_t turn_host = 0, turn_read = 0;
      for (uint32_t j = 0; j < kTurn; ++j) {
        const uint32_t step = r * kTurn + j;
        INFO("round ", r, " session ", i, " step ", step);
        const ssa_decode_stats se = step_both(ref[i], tiered[i], 0, L, step, *out_ref[i], *out_tiered[i], p);
        turn_host += se.rows_from_host + se.host_cache_hits;
        turn_read += se.tokens_read;
        ++steps_checked;
      }
      // Its pages came in at the reservation; what it still reads from the host
      // is mostly the last page, copied there when the budget was full (a
      // checkpoint holds the page: the steps write a copy). Measured on an
      // H200: 8-14% of the rows. Not after the rewrite below (round 1): the
      // truncated pages stay charged to the budget while the last checkpoint's
      // record holds them, until the next checkpoint.
      INFO("round ", r, " session ", i, ": ", turn_host, " of ", turn_read, " rows from the host");
      if (r != 1) CHECK(turn_host * 4 <= turn_read);
      // The turn ends as an agent's does, with a checkpoint, which ends the
      // reservation (a session that holds one keeps its pages: its steps' tables
      // read them). Pages that moved since the last checkpoint hold the same
      // bytes: it appends the turn's rows, not the pages.
      REQUIRE(ssa_session_sync(tiered[i], nullptr) == SSA_OK);
      const uint64_t len = ssa_session_layer_length(tiered[i], 0);
      const off_t before = file_bytes(paths[i]);
      REQUIRE(ssa_session_checkpoint(tiered[i], paths[i].c_str()) == SSA_OK);
      // (the turn after the rewrite below appends the rewritten rows too)
      if (r > 1) CHECK(file_bytes(paths[i]) - before <= 2 * 128 * 1024);  // a turn: 24 rows, 1 KiB each
      if (r == 0) {
        // Pages it brought in, rewritten in place: the back half truncated and
        // appended again with other rows. A host page kept from before the
        // rewrite must not come back when the next turns move these pages out.
        REQUIRE(ssa_session_sync(ref[i], nullptr) == SSA_OK);
        for (ssa_session* x : {ref[i], tiered[i]}) {
          REQUIRE(ssa_session_truncate(x, 2000) == SSA_OK);
          REQUIRE(ssa_session_append(x, 0, rewrite.k_at(2000), rewrite.v_at(2000), len - 2000) == SSA_OK);
        }
      }
    }
  }
  CHECK(steps_checked == uint64_t{kSessions} * kRounds * kTurn);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  for (int i = 0; i < kSessions; ++i) {
    INFO("session ", i);
    CHECK(out_tiered[i]->download(out_tiered[i]->n) == out_ref[i]->download(out_ref[i]->n));
    // The session is the same wherever its pages went: a decode equals the untiered one's.
    Data probe = loops[i]->d;
    const ssa_decode_params pd = params(SSA_METHOD_SSA, 300, 5);
    CHECK(decode(tiered[i], probe, pd, true) == decode(ref[i], probe, pd, true));
  }
  // A session holding a reservation keeps its pages: the next one's turn cannot
  // take them (they hold 33 of the 64 resident pages, the third session's pinned
  // pages 10 more, so the second cannot come in whole), and its steps read what
  // its reservation froze, bitwise the untiered session's.
  REQUIRE(ssa_session_reserve(ref[0], 8) == SSA_OK);
  REQUIRE(ssa_session_reserve(tiered[0], 8) == SSA_OK);
  REQUIRE(ssa_session_reserve(tiered[1], 8) == SSA_OK);
  const Loop& L0 = *loops[0];
  const Loop& L1 = *loops[1];
  ssa_decode_stats s0, s1;
  ssa_decode_stats_init(&s0);
  ssa_decode_stats_init(&s1);
  REQUIRE(ssa_decode_step(ref[0], 0, L0.k_at(0), L0.v_at(0), L0.q_at(1), out_ref[0]->p, &p, nullptr) == SSA_OK);
  REQUIRE(ssa_decode_step(tiered[0], 0, L0.k_at(0), L0.v_at(0), L0.q_at(1), out_tiered[0]->p, &p, &s0) == SSA_OK);
  REQUIRE(ssa_decode_step(tiered[1], 0, L1.k_at(0), L1.v_at(0), L1.q_at(1), out_tiered[1]->p, &p, &s1) == SSA_OK);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  CHECK(s0.rows_from_host + s0.host_cache_hits == 0);
  CHECK(s1.rows_from_host + s1.host_cache_hits > 0);
  CHECK(out_tiered[0]->download(kOut) == out_ref[0]->download(kOut));
  for (int i = 0; i < kSessions; ++i) {
    ssa_session_destroy(ref[i]);
    ssa_session_destroy(tiered[i]);
    std::remove(paths[i].c_str());
  }
  // The shared blocks go with the last session: the library's pool hands out
  // nothing more than before the test began.
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(cuda::device_pool_bytes(true) == used0);
}

// Host pages of each layer of `s` (its K/V pages on the host tier).
std::vector<uint32_t> host_pages_per_layer(ssa_session* s) {
  cuda::SessionState& st = cuda::state(*s);
  absl::MutexLock lock(&st.mu);
  std::vector<uint32_t> n;
  for (const LayerStore& layer : s->layers) {
    uint32_t h = 0;
    for (const PageRef& p : layer.kv_pages) h += p->tier() != PageTier::kDevice;
    n.push_back(h);
  }
  return n;
}

TEST_CASE("gpu graph step: a session filled layer after layer spreads its host pages over its layers at its turn") {
  SSA_GPU_TEST_OR_SKIP();
  // Four layers of 4000 tokens (32 pages of 128 KiB each, 10 pinned), 80 resident
  // pages: filled layer after layer, the last two layers hold the 48 pages beyond
  // the budget. The reservation spreads them: 12 a layer.
  constexpr uint32_t kLayers = 4, kTurn = 16;
  const TurnsRig rig(80);
  const auto& [gpu, rt, st, p] = rig;
  std::vector<std::unique_ptr<Loop>> loops;
  for (uint32_t l = 0; l < kLayers; ++l) loops.push_back(std::make_unique<Loop>(4000, 2 * kTurn, 71 + l));
  auto filled = [&](ssa_runtime* r) {
    ssa_session_config c = ssa_test::make_config(kLayers, kNq, kNkv, kD, SSA_DTYPE_F16);
    c.page_tokens = 128;
    c.index_min_tokens = 1024;
    c.index_regrow_factor = 0.0f;
    ssa_session* s = nullptr;
    REQUIRE(ssa_session_create(r, &c, &s) == SSA_OK);
    for (uint32_t l = 0; l < kLayers; ++l)
      REQUIRE(ssa_session_append(s, l, loops[l]->k_at(0), loops[l]->v_at(0), 4000) == SSA_OK);
    return s;
  };
  ssa_session* ref = filled(gpu);
  ssa_session* tiered = filled(rt);
  const std::vector<uint32_t> before = host_pages_per_layer(tiered);
  uint32_t host_before = 0;
  for (uint32_t h : before) host_before += h;
  MESSAGE("host pages per layer after the fill: ", before[0], " ", before[1], " ", before[2], " ", before[3]);
  CHECK(before[0] == 0);
  CHECK(before[3] >= 20);
  std::vector<std::unique_ptr<DevBuf<uint16_t>>> out_ref, out_tiered;
  for (uint32_t l = 0; l < kLayers; ++l) {
    out_ref.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{2} * kTurn * kOut));
    out_tiered.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{2} * kTurn * kOut));
  }
  std::vector<uint32_t> prev;
  for (uint32_t turn = 0; turn < 2; ++turn) {
    REQUIRE(ssa_session_reserve(ref, kTurn) == SSA_OK);
    REQUIRE(ssa_session_reserve(tiered, kTurn) == SSA_OK);
    const std::vector<uint32_t> at = host_pages_per_layer(tiered);
    INFO("turn ", turn, ": host pages per layer ", at[0], " ", at[1], " ", at[2], " ", at[3]);
    uint32_t lo = at[0], hi = at[0], total = 0;
    for (uint32_t h : at) {
      lo = std::min(lo, h);
      hi = std::max(hi, h);
      total += h;
    }
    CHECK(hi - lo <= 1);
    // As many stay on the host as before, beside the reservation's new pages.
    CHECK(total + kLayers >= host_before);
    CHECK(total <= host_before + kLayers);
    std::vector<uint64_t> layer_host(kLayers, 0);
    for (uint32_t j = 0; j < kTurn; ++j) {
      const uint32_t step = turn * kTurn + j;
      for (uint32_t l = 0; l < kLayers; ++l) {
        INFO("step ", step, " layer ", l);
        const ssa_decode_stats se = step_both(ref, tiered, l, *loops[l], step, *out_ref[l], *out_tiered[l], p);
        layer_host[l] += se.rows_from_host + se.host_cache_hits;
      }
    }
    // Every layer reads rows of host pages now, not the last two alone.
    for (uint32_t l = 0; l < kLayers; ++l) CHECK(layer_host[l] > 0);
    REQUIRE(ssa_session_sync(ref, nullptr) == SSA_OK);
    REQUIRE(ssa_session_sync(tiered, nullptr) == SSA_OK);
    // Spread, the next turn moves nothing back: at most a page per layer more
    // (an older page out for the window's new one).
    for (uint32_t l = 0; l < kLayers && turn == 1; ++l) CHECK((at[l] >= prev[l] && at[l] <= prev[l] + 1));
    prev = at;
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  for (uint32_t l = 0; l < kLayers; ++l) {
    INFO("layer ", l);
    CHECK(out_tiered[l]->download(out_tiered[l]->n) == out_ref[l]->download(out_ref[l]->n));
  }
  ssa_session_destroy(ref);
  ssa_session_destroy(tiered);
}

// Pages of a turn started ahead (ssa_session_prefetch) still being copied in.
size_t pages_in_flight(ssa_session* s) {
  cuda::SessionState& st = cuda::state(*s);
  absl::MutexLock lock(&st.mu);
  return st.incoming.size();
}

TEST_CASE("gpu graph step: a turn started ahead brings the next session's pages in while one decodes, bitwise") {
  SSA_GPU_TEST_OR_SKIP();
  CUDA_OK(cudaDeviceSynchronize());
  const uint64_t used0 = cuda::device_pool_bytes(true);
  const TurnsRig rig(64);  // the trade case's: three sessions of 32 pages
  const auto& [gpu, rt, st, p] = rig;
  constexpr int kSessions = 3;
  constexpr uint32_t kTurn = 24, kRounds = 3;
  std::vector<std::unique_ptr<Loop>> loops;
  std::vector<ssa_session*> ref, tiered;
  std::vector<std::unique_ptr<DevBuf<uint16_t>>> out_ref, out_tiered;
  const std::string path = std::string(P_tmpdir) + "/ssa_gpu_prefetch_" + std::to_string(getpid());
  // A save ends the session's reservation, as an agent's checkpoint after its turn.
  auto end_turn = [&](ssa_session* x) {
    REQUIRE(ssa_session_sync(x, nullptr) == SSA_OK);
    std::remove(path.c_str());
    REQUIRE(ssa_session_save(x, path.c_str()) == SSA_OK);
  };
  for (int i = 0; i < kSessions; ++i) {
    loops.push_back(std::make_unique<Loop>(4000, kTurn * kRounds, 141 + i));
    ref.push_back(prompted(gpu, *loops[i]));
    tiered.push_back(prompted(rt, *loops[i]));
    out_ref.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{kTurn} * kRounds * kOut));
    out_tiered.push_back(std::make_unique<DevBuf<uint16_t>>(size_t{kTurn} * kRounds * kOut));
  }
  // Nothing to move: an untiered session, one holding a reservation.
  CHECK(ssa_session_prefetch(ref[0], kTurn) == SSA_OK);
  CHECK(pages_in_flight(ref[0]) == 0);
  uint64_t started = 0;
  for (uint32_t r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kSessions; ++i) {
      const Loop& L = *loops[i];
      ssa_session* next = tiered[(i + 1) % kSessions];
      REQUIRE(ssa_session_reserve(ref[i], kTurn) == SSA_OK);
      REQUIRE(ssa_session_reserve(tiered[i], kTurn) == SSA_OK);
      CHECK(pages_in_flight(tiered[i]) == 0);  // taken in by the reservation
      CHECK(ssa_session_prefetch(tiered[i], kTurn) == SSA_OK);  // reserved: nothing
      CHECK(pages_in_flight(tiered[i]) == 0);
      // The next session's pages cross while this one's steps run on `st`.
      REQUIRE(ssa_session_prefetch(next, kTurn) == SSA_OK);
      MESSAGE("round ", r, " session ", i, ": pages the next session's turn started copying: ", pages_in_flight(next));
      started += pages_in_flight(next);
      uint64_t turn_host = 0, turn_read = 0;
      for (uint32_t j = 0; j < kTurn; ++j) {
        const uint32_t step = r * kTurn + j;
        const ssa_decode_stats se = step_both(ref[i], tiered[i], 0, L, step, *out_ref[i], *out_tiered[i], p);
        turn_host += se.rows_from_host + se.host_cache_hits;
        turn_read += se.tokens_read;
      }
      // After the first round each session's turn was started ahead: its pages
      // came in before its reservation, as in the trade case.
      INFO("round ", r, " session ", i, ": ", turn_host, " of ", turn_read, " rows from the host");
      if (r >= 1) CHECK(turn_host * 4 <= turn_read);
      end_turn(tiered[i]);
    }
  }
  CHECK(started > 0);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  for (int i = 0; i < kSessions; ++i) {
    INFO("session ", i);
    CHECK(out_tiered[i]->download(out_tiered[i]->n) == out_ref[i]->download(out_ref[i]->n));
  }
  // Rewritten after its turn started: the back half truncated and appended again
  // with other rows. The rewritten pages' copies are stale and must not come in.
  {
    const Loop rewrite(4000 + kTurn * kRounds, 1, 197);
    REQUIRE(ssa_session_prefetch(tiered[1], 0) == SSA_OK);
    const uint64_t len = ssa_session_layer_length(tiered[1], 0);
    REQUIRE(ssa_session_sync(ref[1], nullptr) == SSA_OK);
    for (ssa_session* x : {ref[1], tiered[1]}) {
      REQUIRE(ssa_session_truncate(x, 2000) == SSA_OK);
      REQUIRE(ssa_session_append(x, 0, rewrite.k_at(2000), rewrite.v_at(2000), len - 2000) == SSA_OK);
    }
    REQUIRE(ssa_session_reserve(tiered[1], 8) == SSA_OK);
    CHECK(pages_in_flight(tiered[1]) == 0);
    end_turn(tiered[1]);
  }
  // Wherever their pages are, the sessions decode as the untiered ones.
  for (int i = 0; i < kSessions; ++i) {
    INFO("session ", i);
    REQUIRE(ssa_session_sync(ref[i], nullptr) == SSA_OK);
    Data probe = loops[i]->d;
    const ssa_decode_params pd = params(SSA_METHOD_SSA, 300, 5);
    CHECK(decode(tiered[i], probe, pd, true) == decode(ref[i], probe, pd, true));
  }
  for (int i = 0; i < kSessions; ++i) {
    ssa_session_destroy(tiered[i]);
    ssa_session_destroy(ref[i]);
  }
  {
    // Two sessions and room for about one (48 resident pages): a session given
    // up before it reserves drops its copies once they land, and one destroyed
    // with copies in flight gives its blocks back after them.
    ssa_runtime* rt2 = turns_runtime(48);
    ssa_session* a = prompted(rt2, *loops[0]);
    ssa_session* b = prompted(rt2, *loops[1]);
    ssa_session* a_ref = prompted(gpu, *loops[0]);
    REQUIRE(ssa_session_reserve(a, 8) == SSA_OK);  // a comes in; b's pages go out
    end_turn(a);  // a is idle
    REQUIRE(ssa_session_prefetch(b, 8) == SSA_OK);  // a, the only peer, gives up pages to it
    const size_t flying = pages_in_flight(b);
    MESSAGE("pages of b's turn started ahead: ", flying);
    CHECK(flying > 0);
    REQUIRE(ssa_session_reserve(a, 8) == SSA_OK);  // b, idle, gives up: its copies go
    CHECK(pages_in_flight(b) == 0);
    const Data probe = loops[0]->d;
    const ssa_decode_params pd = params(SSA_METHOD_SSA, 300, 5);
    end_turn(a);
    CHECK(decode(a, probe, pd, true) == decode(a_ref, probe, pd, true));
    REQUIRE(ssa_session_prefetch(b, 8) == SSA_OK);
    MESSAGE("pages in flight when b is destroyed: ", pages_in_flight(b));
    CHECK(pages_in_flight(b) > 0);
    ssa_session_destroy(b);
    ssa_session_destroy(a);
    ssa_session_destroy(a_ref);
    ssa_runtime_destroy(rt2);
  }
  std::remove(path.c_str());
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(cuda::device_pool_bytes(true) == used0);
}

TEST_CASE("gpu graph step: what a graph cannot hold is refused at capture, with nothing changed") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Loop L(2000, 10, 7);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  auto refused_at_capture = [&](ssa_session* s, const ssa_decode_params& p, ssa_status want, bool stats = false) {
    DevBuf<uint16_t> out(kOut);
    ssa_decode_stats sd;
    ssa_decode_stats_init(&sd);
    const CapturedGraph g(st, [&] {
      return ssa_decode_step(s, 0, L.k_at(0), L.v_at(0), L.q_at(0), out.p, &p, stats ? &sd : nullptr);
    });
    INFO(g.message);
    CHECK(g.status == want);
    CHECK(!g.message.empty());
    CHECK(ssa_session_layer_length(s, 0) == L.prompt);
  };
  ssa_session* s = prompted(gpu, L, 4.0f);
  const ssa_decode_params p = step_params(SSA_METHOD_SSA, st);
  // Without a reservation the step appends on the host (and may train): refused.
  refused_at_capture(s, p, SSA_ERR_INVALID_ARGUMENT);
  REQUIRE(ssa_session_reserve(s, 8) == SSA_OK);
  ssa_decode_params targeted = p;
  targeted.target_error = 0.1f;
  refused_at_capture(s, targeted, SSA_ERR_UNSUPPORTED);  // error target: rounds on the host
  ssa_decode_params mixture = p;
  mixture.group_selection = SSA_GROUP_MIXTURE;
  refused_at_capture(s, mixture, SSA_ERR_UNSUPPORTED);
  refused_at_capture(s, p, SSA_ERR_INVALID_ARGUMENT, true);  // stats need a wait
  // The eager form of the same refusals.
  DevBuf<uint16_t> out(kOut);
  CHECK(ssa_decode_step(s, 0, L.k_at(0), L.v_at(0), L.q_at(0), out.p, &targeted, nullptr) == SSA_ERR_UNSUPPORTED);
  // Past the reservation: 8 reserved; the host's count refuses once committed.
  for (uint32_t i = 0; i < 8; ++i) {
    REQUIRE(ssa_decode_step(s, 0, L.k_at(L.prompt + i), L.v_at(L.prompt + i), L.q_at(i), out.p, &p, nullptr) == SSA_OK);
  }
  uint64_t dropped = 5;
  REQUIRE(ssa_session_sync(s, &dropped) == SSA_OK);
  CHECK(dropped == 0);
  CHECK(ssa_session_layer_length(s, 0) == L.prompt + 8);
  CHECK(ssa_decode_step(s, 0, L.k_at(0), L.v_at(0), L.q_at(0), out.p, &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  ssa_session_destroy(s);

  // Sessions a reservation cannot serve.
  {
    ssa_session* h = session(gpu, SSA_SESSION_HOST_POINTERS);
    REQUIRE(ssa_session_append(h, 0, L.d.k.data(), L.d.v.data(), L.prompt) == SSA_OK);
    CHECK(ssa_session_reserve(h, 8) == SSA_ERR_UNSUPPORTED);
    ssa_session_destroy(h);
  }
  {
    const std::string path = std::string(P_tmpdir) + "/ssa_graph_mmap_" + std::to_string(getpid()) + ".ssa";
    ssa_session* src = prompted(gpu, L);
    REQUIRE(ssa_session_save(src, path.c_str()) == SSA_OK);
    ssa_session* mapped = nullptr;
    REQUIRE(ssa_session_load(gpu, path.c_str(), SSA_LOAD_MMAP, &mapped) == SSA_OK);
    CHECK(ssa_session_reserve(mapped, 8) == SSA_ERR_UNSUPPORTED);
    ssa_session_destroy(mapped);
    ssa_session_destroy(src);
    std::remove(path.c_str());
  }
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices >= 2) {
    ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
    const int32_t list[] = {0, 1};
    o.devices = list;
    o.n_devices = 2;
    ssa_runtime* sharded = nullptr;
    if (ssa_runtime_create(&o, &sharded) == SSA_OK) {
      ssa_session* sh = prompted(sharded, L);
      CHECK(ssa_session_reserve(sh, 8) == SSA_ERR_UNSUPPORTED);
      ssa_session_destroy(sh);
      ssa_runtime_destroy(sharded);
    }
  } else {
    MESSAGE("one device: the sharded refusal is not exercised here");
  }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu graph step: replays past the reservation, after truncate, update_index or destroy do nothing") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Loop L(2500, 40, 13);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  const ssa_decode_params p = step_params(SSA_METHOD_SSA, st);
  const std::vector<uint16_t> untouched(kOut, 0xffff);
  DevBuf<uint16_t> outs(size_t{L.steps} * kOut);

  SUBCASE("past the reservation: the extra replays are dropped and counted") {
    ssa_session* s = prompted(gpu, L);
    REQUIRE(ssa_session_reserve(s, 5) == SSA_OK);
    StepGraph g(s, p, st);
    REQUIRE(g.graph.status == SSA_OK);
    for (uint32_t i = 0; i < 8; ++i) g.replay(L, L.prompt + i, i, outs.p + size_t{i} * kOut, st);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    const auto all = outs.download(8 * kOut);
    for (uint32_t i = 0; i < 8; ++i) CHECK((slice(all, i) == untouched) == (i >= 5));
    uint64_t dropped = 0;
    REQUIRE(ssa_session_sync(s, &dropped) == SSA_OK);
    CHECK(dropped == 3);
    CHECK(ssa_session_layer_length(s, 0) == L.prompt + 5);
    ssa_session_destroy(s);
  }
  SUBCASE("truncate ends the reservation; reserve and capture again to go on") {
    ssa_session* s = prompted(gpu, L);
    ssa_session* ref = prompted(gpu, L);
    REQUIRE(ssa_session_reserve(s, 30) == SSA_OK);
    {
      StepGraph g(s, p, st);
      REQUIRE(g.graph.status == SSA_OK);
      for (uint32_t i = 0; i < 10; ++i) g.replay(L, L.prompt + i, i, outs.p + size_t{i} * kOut, st);
      REQUIRE(ssa_session_truncate(s, L.prompt + 4) == SSA_OK);  // waits for the replays, then cuts
      CHECK(ssa_session_layer_length(s, 0) == L.prompt + 4);
      g.replay(L, L.prompt + 4, 4, outs.p, st);
      REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
      CHECK(outs.download(kOut) == untouched);
      uint64_t dropped = 0;
      REQUIRE(ssa_session_sync(s, &dropped) == SSA_OK);
      CHECK(dropped == 1);
      CHECK(ssa_session_layer_length(s, 0) == L.prompt + 4);
    }
    // Again from token prompt + 4: the outputs of a session that never went
    // further, reserved the same from there (so the same launch plan: bitwise).
    REQUIRE(ssa_session_reserve(ref, 30) == SSA_OK);
    for (uint32_t i = 0; i < 4; ++i) {
      REQUIRE(ssa_decode_step(ref, 0, L.k_at(L.prompt + i), L.v_at(L.prompt + i), L.q_at(i), outs.p, &p, nullptr) ==
              SSA_OK);
    }
    REQUIRE(ssa_session_reserve(ref, 30) == SSA_OK);
    REQUIRE(ssa_session_reserve(s, 30) == SSA_OK);
    StepGraph g2(s, p, st);
    REQUIRE(g2.graph.status == SSA_OK);
    DevBuf<uint16_t> want(size_t{L.steps} * kOut);
    for (uint32_t i = 4; i < 20; ++i) {
      g2.replay(L, L.prompt + i, i, outs.p + size_t{i} * kOut, st);
      REQUIRE(ssa_decode_step(ref, 0, L.k_at(L.prompt + i), L.v_at(L.prompt + i), L.q_at(i),
                              want.p + size_t{i} * kOut, &p, nullptr) == SSA_OK);
    }
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    const auto got = outs.download(outs.n), expect = want.download(want.n);
    for (uint32_t i = 4; i < 20; ++i) CHECK(slice(got, i) == slice(expect, i));
    ssa_session_destroy(s);
    ssa_session_destroy(ref);
  }
  SUBCASE("update_index ends the reservation (retraining happens between replays)") {
    ssa_session* s = prompted(gpu, L);
    REQUIRE(ssa_session_reserve(s, 30) == SSA_OK);
    StepGraph g(s, p, st);
    REQUIRE(g.graph.status == SSA_OK);
    for (uint32_t i = 0; i < 3; ++i) g.replay(L, L.prompt + i, i, outs.p, st);
    REQUIRE(ssa_session_update_index(s) == SSA_OK);
    CHECK(ssa_session_layer_length(s, 0) == L.prompt + 3);
    g.replay(L, L.prompt + 3, 3, outs.p, st);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(outs.download(kOut) == untouched);
    uint64_t dropped = 0;
    REQUIRE(ssa_session_sync(s, &dropped) == SSA_OK);
    CHECK(dropped == 1);
    ssa_session_destroy(s);
  }
  SUBCASE("destroy: a later replay reads nothing of the session and writes nothing") {
    ssa_session* s = prompted(gpu, L);
    REQUIRE(ssa_session_reserve(s, 30) == SSA_OK);
    StepGraph g(s, p, st);
    REQUIRE(g.graph.status == SSA_OK);
    g.replay(L, L.prompt, 0, outs.p, st);
    ssa_session_destroy(s);
    // The memory is reused by a new session, whose decodes must be unharmed.
    ssa_session* again = prompted(gpu, L);
    ssa_session* ref = prompted(gpu, L);
    for (int rep = 0; rep < 3; ++rep) g.replay(L, L.prompt, 0, outs.p, st);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);  // no fault
    CHECK(outs.download(kOut) == untouched);
    const ssa_decode_params pd = params(SSA_METHOD_SSA, 700, 3);
    CHECK(decode(again, L.d, pd, true) == decode(ref, L.d, pd, true));
    ssa_session_destroy(again);
    ssa_session_destroy(ref);
  }
  cudaStreamDestroy(st);
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
