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
