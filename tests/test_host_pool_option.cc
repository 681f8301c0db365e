// ssa_runtime_options.host_pool_bytes on a machine without a GPU: invalid values
// are refused with a message naming the option on every backend (before any
// device is looked at), and CPU runtimes accept a valid one and ignore it: their
// sessions decode bitwise as those of a runtime without it. The pool itself (a
// CUDA runtime's sessions taking their host pages from it) is tested in
// tests/gpu/test_gpu_tiers.cc.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "support/handles.h"
#include "support/session_helpers.h"

namespace ssa_test {
namespace {

constexpr uint64_t kChunk = uint64_t{64} << 20;

ssa_runtime_options pool_options(ssa_backend b, uint64_t budget, uint64_t pool) {
  ssa_runtime_options o = runtime_options(b, 1);
  o.device_kv_budget = budget;
  o.host_pool_bytes = pool;
  return o;
}

TEST_CASE("host_pool_bytes: invalid values are refused on every backend, with no runtime") {
  struct Bad {
    uint64_t budget, pool;
    const char* words;
  };
  const Bad bad[] = {
      {uint64_t{1} << 30, 1, "multiple of"},
      {uint64_t{1} << 30, kChunk - 1, "multiple of"},
      {uint64_t{1} << 30, kChunk + 4096, "multiple of"},
      {uint64_t{1} << 30, ~uint64_t{0}, "multiple of"},
      {0, kChunk, "needs a device_kv_budget"},
      {0, 16 * kChunk, "needs a device_kv_budget"},
  };
  for (const ssa_backend b : {SSA_BACKEND_CPU, SSA_BACKEND_AUTO, SSA_BACKEND_CUDA}) {
    for (const Bad& x : bad) {
      const ssa_runtime_options o = pool_options(b, x.budget, x.pool);
      ssa_runtime* rt = reinterpret_cast<ssa_runtime*>(&rt);  // must be left alone
      ssa_runtime* const before = rt;
      CAPTURE(b);
      CAPTURE(x.pool);
      CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
      CHECK(rt == before);
      const std::string msg = ssa_last_error_message();
      CAPTURE(msg);
      CHECK(msg.find("host_pool_bytes") != std::string::npos);
      CHECK(msg.find(x.words) != std::string::npos);
    }
  }
}

TEST_CASE("host_pool_bytes: CPU runtimes accept a valid pool and ignore it") {
  const uint32_t n = 3000, n_kv = 2, n_q = 4, d = 32;
  const std::vector<float> K = random_vec(size_t{n} * n_kv * d, 11), V = random_vec(size_t{n} * n_kv * d, 12);
  const std::vector<float> q = random_vec(size_t{n_q} * d, 13);
  const ssa_session_config c = make_config(1, n_q, n_kv, d);
  auto outputs = [&](const ssa_runtime_options& o) {
    ssa_runtime* raw = nullptr;
    SSA_CHECK_OK(ssa_runtime_create(&o, &raw));
    RuntimePtr rt(raw);
    CHECK(ssa_runtime_backend(rt.get()) == SSA_BACKEND_CPU);
    SessionPtr s = make_session(rt.get(), c);
    append_f32(s.get(), 0, K, V, n, SSA_DTYPE_F16);
    std::vector<std::vector<float>> outs;
    for (const ssa_method m : kAllMethods) {
      ssa_decode_params p = params(m, 300);
      p.seed = 5;
      outs.push_back(run_decode(s.get(), 0, q, SSA_DTYPE_F16, p));
    }
    return outs;
  };
  const auto ref = outputs(pool_options(SSA_BACKEND_CPU, 0, 0));
  // A pool far larger than this machine's memory: nothing is page-locked on the CPU.
  for (const uint64_t pool : {kChunk, uint64_t{1} << 50}) {
    CAPTURE(pool);
    CHECK(outputs(pool_options(SSA_BACKEND_CPU, uint64_t{1} << 30, pool)) == ref);
  }
  // AUTO resolves to the CPU on a machine without a device (the only kind this test
  // checks: with a device AUTO is a CUDA runtime that would page-lock the pool).
  ssa_runtime* probe = nullptr;
  const ssa_runtime_options plain = runtime_options(SSA_BACKEND_AUTO, 1);
  SSA_CHECK_OK(ssa_runtime_create(&plain, &probe));
  const bool auto_is_cpu = ssa_runtime_backend(probe) == SSA_BACKEND_CPU;
  ssa_runtime_destroy(probe);
  if (auto_is_cpu) CHECK(outputs(pool_options(SSA_BACKEND_AUTO, uint64_t{1} << 30, uint64_t{1} << 50)) == ref);
}

}  // namespace
}  // namespace ssa_test
