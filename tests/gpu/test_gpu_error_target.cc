// Error-targeted decode (target_error > 0) is a CPU-only feature: a CUDA session
// must refuse it with SSA_ERR_UNSUPPORTED and a message, write no output, and
// still decode normally afterwards.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "support/gpu_sessions.h"
#include "support/gpu_layer.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

TEST_CASE("gpu backend: target_error > 0 is refused with SSA_ERR_UNSUPPORTED") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* rt = runtime(SSA_BACKEND_CUDA);
  ssa_session* s = session(rt, SSA_SESSION_HOST_POINTERS);
  const Data d = make_data(3000, 3);
  fill(s, d, false);
  const std::vector<uint16_t>& q = d.q;

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
