// Error-targeted decode (target_error > 0) is a CPU-only feature: a CUDA session
// must refuse it with SSA_ERR_UNSUPPORTED and a message, write no output, and
// still decode normally afterwards.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gpu_test_util.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

TEST_CASE("gpu backend: target_error > 0 is refused with SSA_ERR_UNSUPPORTED") {
  SSA_GPU_TEST_OR_SKIP();
  constexpr uint32_t nq = 4, nkv = 2, d = 64, n = 3000;
  ssa_runtime_options o;
  ssa_runtime_options_init(&o);
  o.backend = SSA_BACKEND_CUDA;
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  ssa_session_config c;
  ssa_session_config_init(&c);
  c.n_layers = 1;
  c.n_q_heads = nq;
  c.n_kv_heads = nkv;
  c.head_dim = d;
  c.kv_dtype = SSA_DTYPE_F16;
  c.flags = SSA_SESSION_HOST_POINTERS;
  ssa_session* s = nullptr;
  REQUIRE(ssa_session_create(rt, &c, &s) == SSA_OK);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> k(size_t{n} * nkv * d), v(k.size()), q(size_t{nq} * d);
  for (auto& x : k) x = f32_to_f16(g(rng));
  for (auto& x : v) x = f32_to_f16(g(rng));
  for (auto& x : q) x = f32_to_f16(g(rng));
  REQUIRE(ssa_session_append(s, 0, k.data(), v.data(), n) == SSA_OK);

  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    ssa_decode_params p;
    ssa_decode_params_init(&p);
    p.method = m;
    p.target_error = 0.1f;
    std::vector<uint16_t> out(q.size(), 0x7777);
    CHECK(ssa_decode(s, 0, q.data(), out.data(), &p, nullptr) == SSA_ERR_UNSUPPORTED);
    const std::string msg = ssa_last_error_message();
    CAPTURE(msg);
    CHECK(msg.find("CUDA") != std::string::npos);
    CHECK(msg.find("target_error") != std::string::npos);
    ssa_decode_item item{s, q.data(), out.data()};
    CHECK(ssa_decode_batch(&item, 1, 0, &p) == SSA_ERR_UNSUPPORTED);
    for (uint16_t x : out) CHECK(x == 0x7777);
    // The same request without a target works.
    p.target_error = 0.0f;
    CHECK(ssa_decode(s, 0, q.data(), out.data(), &p, nullptr) == SSA_OK);
  }
  ssa_session_destroy(s);
  ssa_runtime_destroy(rt);
}

}  // namespace
}  // namespace ssa::gputest
