// The header's thread-safety rules: decodes of one session run beside each other
// and beside appends, truncations and forks, and each decode sees one committed
// state (never a torn one).
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

TEST_CASE("decodes beside appends, truncates and forks see whole committed states") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t base = 1500, step = 100, steps = 8;
  const auto ctx = make_structured_context(base + step * steps, nkv, nq, d);
  auto cfg = make_config(1, nq, nkv, d, SSA_DTYPE_F32);
  cfg.index_min_tokens = 1u << 30;  // exact methods only: no index timing in play
  auto rows = [&](const std::vector<float>& a, size_t t0, size_t t1) {
    return std::vector<float>(a.begin() + t0 * nkv * d, a.begin() + t1 * nkv * d);
  };
  // Expected dense output for every length the session will pass through.
  std::map<uint64_t, std::vector<float>> expected;
  {
    auto ref = make_session(rt.get(), cfg);
    append_f32(ref.get(), 0, rows(ctx.K, 0, base), rows(ctx.V, 0, base), base, SSA_DTYPE_F32);
    for (size_t i = 0;; ++i) {
      expected[base + i * step] = run_decode(ref.get(), 0, ctx.q, SSA_DTYPE_F32, params(SSA_METHOD_DENSE));
      if (i == steps) break;
      const size_t t0 = base + i * step;
      append_f32(ref.get(), 0, rows(ctx.K, t0, t0 + step), rows(ctx.V, t0, t0 + step), step, SSA_DTYPE_F32);
    }
  }
  auto s = make_session(rt.get(), cfg);
  append_f32(s.get(), 0, rows(ctx.K, 0, base), rows(ctx.V, 0, base), base, SSA_DTYPE_F32);
  std::atomic<bool> stop{false};
  std::atomic<int> decodes{0}, torn{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        ssa_decode_stats st;
        ssa_decode_stats_init(&st);
        const auto out = run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F32, params(SSA_METHOD_DENSE), &st);
        auto it = expected.find(st.context_tokens);
        if (it == expected.end() || it->second != out) ++torn;
        ++decodes;
      }
    });
  }
  // At least three rounds, and more until the readers have checked enough decodes
  // (on a loaded machine the writer can finish three rounds before a reader runs).
  for (int round = 0; round < 3 || (decodes.load() <= 30 && round < 1000); ++round) {
    for (size_t i = 0; i < steps; ++i) {
      const size_t t0 = base + i * step;
      append_f32(s.get(), 0, rows(ctx.K, t0, t0 + step), rows(ctx.V, t0, t0 + step), step, SSA_DTYPE_F32);
      ssa_session* f = nullptr;
      SSA_CHECK_OK(ssa_session_fork(s.get(), &f));
      SessionPtr fork(f);
      CHECK(run_decode(fork.get(), 0, ctx.q, SSA_DTYPE_F32, params(SSA_METHOD_DENSE)) == expected[t0 + step]);
    }
    SSA_CHECK_OK(ssa_session_truncate(s.get(), base));
  }
  stop = true;
  for (auto& t : readers) t.join();
  MESSAGE(decodes.load() << " concurrent decodes checked");
  CHECK(decodes.load() > 30);
  CHECK(torn.load() == 0);
}

// A runtime keeps its decodes' buffers between calls (lib/decode/decode_buffers.h):
// decodes of other shapes, lengths, methods and group modes, one after another
// and from several threads at once, must each give what the same decode gives
// on a runtime that never decoded before.
TEST_CASE("decodes that reuse a runtime's buffers equal decodes on a fresh runtime") {
  struct Shape {
    uint32_t nq, nkv, d;
    size_t n;
  };
  const Shape shapes[] = {{8, 2, 64, 5000}, {4, 4, 32, 700}, {6, 1, 48, 9000}};
  struct Case {
    int shape;
    ssa_method method;
    ssa_group_selection group;
    float sparsity;
  };
  std::vector<Case> cases;
  for (int sh = 0; sh < 3; ++sh) {
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA_ADAPTIVE, SSA_METHOD_DENSE}) {
      cases.push_back({sh, m, SSA_GROUP_OFF, 20.0f});
    }
    cases.push_back({sh, SSA_METHOD_SSA, SSA_GROUP_MIXTURE, 10.0f});
    cases.push_back({sh, SSA_METHOD_SAMPLING, SSA_GROUP_MEAN_QUERY, 50.0f});
  }
  auto fill = [&](ssa_runtime* rt, int sh) {
    const Shape& x = shapes[sh];
    StructuredOptions o;
    o.seed = 17u + static_cast<uint64_t>(sh);
    const auto ctx = make_structured_context(x.n, x.nkv, x.nq, x.d, o);
    auto cfg = make_config(1, x.nq, x.nkv, x.d, SSA_DTYPE_F32);
    cfg.index_min_tokens = 512;
    auto s = make_session(rt, cfg);
    append_f32(s.get(), 0, ctx.K, ctx.V, x.n, SSA_DTYPE_F32);
    return std::make_pair(std::move(s), ctx.q);
  };
  auto decode = [&](ssa_session* s, const std::vector<float>& q, const Case& c, uint64_t step) {
    ssa_decode_params p = params(c.method, 0, c.sparsity);
    p.group_selection = c.group;
    p.step = step;
    p.n_sink = 16;
    p.n_local = 32;
    return run_decode(s, 0, q, SSA_DTYPE_F32, p);
  };
  // References: each case on its own runtime, its first decode.
  std::vector<std::vector<float>> want;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto rt = make_runtime(2);
    auto [s, q] = fill(rt.get(), cases[i].shape);
    want.push_back(decode(s.get(), q, cases[i], i));
  }
  using Sessions = std::vector<std::pair<SessionPtr, std::vector<float>>>;
  auto fill_all = [&](ssa_runtime* rt) {
    Sessions out;
    for (int sh = 0; sh < 3; ++sh) out.push_back(fill(rt, sh));
    return out;
  };
  // In turn, largest context first so later, smaller decodes find larger buffers.
  auto in_turn = [&](Sessions& sessions, const char* runtime) {
    for (int round = 0; round < 2; ++round) {
      for (size_t k = 0; k < cases.size(); ++k) {
        const size_t i = round == 0 ? (k + 2 * cases.size() / 3) % cases.size() : cases.size() - 1 - k;
        auto& [s, q] = sessions[cases[i].shape];
        CHECK_MESSAGE(decode(s.get(), q, cases[i], i) == want[i], runtime << ", case " << i << " round " << round);
      }
    }
  };
  auto rt = make_runtime(2);
  Sessions sessions = fill_all(rt.get());
  in_turn(sessions, "unsharded");
  // At once: three threads, each through every case in its own order.
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r) {
        for (size_t k = 0; k < cases.size(); ++k) {
          const size_t i = (k * (t + 1) + r) % cases.size();
          auto& [s, q] = sessions[cases[i].shape];
          if (decode(s.get(), q, cases[i], i) != want[i]) ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  // In turn again on a runtime of two in-process shards, whose ranks' parts of a
  // decode take the kept buffers too; sharded decodes equal unsharded ones bit
  // for bit (test_sharding.cc), so the same references hold.
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 2);
  o.seed = 1234;
  const int32_t devices[2] = {0, 1};
  o.devices = devices;
  o.n_devices = 2;
  o.shard_tokens = 8192;  // the 9000-token context spans both shards
  ssa_runtime* raw = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &raw));
  RuntimePtr sharded(raw);
  REQUIRE(ssa_runtime_num_shards(sharded.get()) == 2);
  Sessions on_shards = fill_all(sharded.get());
  in_turn(on_shards, "2 shards");
}
