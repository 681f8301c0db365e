// A decode on a CUDA stream returns once its kernels are queued. Whatever the
// host does to the session next (truncate, append, retrain, destroy), the queued
// decodes must read the layer as it was when they were called: its pages, codes
// and codebooks stay alive and unwritten until those decodes have run, without
// the host waiting for the device as a whole.
//
// The stream is held by a host callback that sleeps, so every queued decode runs
// only after the host's changes have been made: a change that frees, recycles or
// overwrites what they read shows up as a wrong output.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

constexpr ssa_method kMethods[] = {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK};
constexpr int kRepeats = 3;  // each method queued this many times
constexpr size_t kOut = size_t{kNq} * kD;

void hold_stream(cudaStream_t st) {
  auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  REQUIRE(cudaLaunchHostFunc(st, sleep, nullptr) == cudaSuccess);
}

// Queues the decodes on st behind a held stream, runs `change` (which returns the
// session, or nullptr once it destroyed it), then checks every queued output
// against the same decodes run before, one at a time.
void check_queued(ssa_runtime* gpu, const Data& d, const std::function<ssa_session*(ssa_session*)>& change) {
  ssa_session* s = session(gpu, 0);
  fill(s, d, true);
  std::vector<std::vector<uint16_t>> ref;
  for (ssa_method m : kMethods) ref.push_back(decode(s, d, params(m, 900, 3), true));
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  DevBuf<uint16_t> q(d.q.size()), out(kRepeats * std::size(kMethods) * kOut);
  q.upload(d.q);
  REQUIRE(cudaMemset(out.p, 0xff, out.n * sizeof(uint16_t)) == cudaSuccess);
  hold_stream(st);
  for (int r = 0; r < kRepeats; ++r)
    for (size_t i = 0; i < std::size(kMethods); ++i) {
      ssa_decode_params p = params(kMethods[i], 900, 3);
      p.stream = st;
      REQUIRE(ssa_decode(s, 0, q.p, out.p + (r * std::size(kMethods) + i) * kOut, &p, nullptr) == SSA_OK);
    }
  s = change(s);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  const std::vector<uint16_t> got = out.download(out.n);
  for (int r = 0; r < kRepeats; ++r)
    for (size_t i = 0; i < std::size(kMethods); ++i) {
      INFO("method ", kMethods[i], ", repeat ", r);
      const auto* o = got.data() + (r * std::size(kMethods) + i) * kOut;
      CHECK(std::vector<uint16_t>(o, o + kOut) == ref[i]);
    }
  cudaStreamDestroy(st);
  ssa_session_destroy(s);
}

TEST_CASE("gpu backend: queued decodes read the layer as it was when they were called") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(20000, 5);  // 20000 % 128 != 0: the last page is partly filled
  const Data other = make_data(20000, 6);
  DevBuf<uint16_t> k(other.k.size()), v(other.v.size()), q(other.q.size()), o(kOut);
  k.upload(other.k);
  v.upload(other.v);
  q.upload(other.q);
  // A decode of the session's new contents (default stream, into o).
  auto decode_now = [&](ssa_session* s, ssa_method m) {
    ssa_decode_params p = params(m, 900, 3);
    REQUIRE(ssa_decode(s, 0, q.p, o.p, &p, nullptr) == SSA_OK);
  };

  SUBCASE("truncate, then append other rows over the ones being read") {
    check_queued(gpu, d, [&](ssa_session* s) {
      REQUIRE(ssa_session_truncate(s, d.n - 1000) == SSA_OK);
      REQUIRE(ssa_session_append(s, 0, k.p, v.p, 1000) == SSA_OK);
      return s;
    });
  }
  SUBCASE("truncate to nothing, append other keys, decode them") {
    check_queued(gpu, d, [&](ssa_session* s) {
      REQUIRE(ssa_session_truncate(s, 0) == SSA_OK);
      REQUIRE(ssa_session_append(s, 0, k.p, v.p, other.n) == SSA_OK);
      decode_now(s, SSA_METHOD_SSA);  // new tables replace the ones the queued decodes read
      return s;
    });
  }
  SUBCASE("retrain the index, append (new code pages may reuse freed ones), decode") {
    check_queued(gpu, d, [&](ssa_session* s) {
      REQUIRE(ssa_session_update_index(s) == SSA_OK);
      REQUIRE(ssa_session_append(s, 0, k.p, v.p, other.n) == SSA_OK);
      decode_now(s, SSA_METHOD_PQ_TOPK);
      return s;
    });
  }
  SUBCASE("destroy the session") {
    check_queued(gpu, d, [&](ssa_session* s) {
      ssa_session_destroy(s);
      return static_cast<ssa_session*>(nullptr);
    });
  }
  SUBCASE("a fork appends into the shared last page") {
    check_queued(gpu, d, [&](ssa_session* s) {
      ssa_session* f = nullptr;
      REQUIRE(ssa_session_fork(s, &f) == SSA_OK);
      REQUIRE(ssa_session_truncate(s, d.n - 1000) == SSA_OK);
      REQUIRE(ssa_session_append(f, 0, k.p, v.p, 1000) == SSA_OK);
      ssa_session_destroy(f);
      return s;
    });
  }
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
