// ssa_session_append_async queues the copy of K/V (and their codes) on the
// caller's stream and returns. The stream is held by a host callback that sleeps,
// so every queued append runs only after the host has gone on: the session must
// show the tokens at once, decodes queued behind the appends on the same stream
// must read them, and the library's own later work on the session (a fork's
// copy-on-write, save, truncate and append again, destroy) must come after the
// queued copies. Every output is checked bitwise against a session fed the same
// tokens with plain ssa_session_append.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

constexpr ssa_method kMethods[] = {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK};
constexpr size_t kRow = size_t{kNkv} * kD;
constexpr size_t kOut = size_t{kNq} * kD;

void hold_stream(cudaStream_t st) {
  auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  REQUIRE(cudaLaunchHostFunc(st, sleep, nullptr) == cudaSuccess);
}

// Sessions without automatic retraining: after the first training (at 1024
// tokens) every append below is queued, none waits to retrain.
ssa_session* async_session(ssa_runtime* gpu) { return session(gpu, 0, SSA_DTYPE_F16, 0.0f); }

// The appends of both sessions: tokens [0, 700) (no index yet), then past the
// training threshold (1024: the async append waits and trains), single tokens
// (encoded with the codebooks), a run across pages, and the rest in one append
// of more pages than one row-copy launch takes (64), with codes.
std::vector<uint32_t> chunks(uint32_t n) {
  std::vector<uint32_t> c = {700, 700, 1, 1, 1, 1, 1, 300};
  uint32_t used = 0;
  for (uint32_t x : c) used += x;
  c.push_back(n - used);
  return c;
}

struct Feed {
  DevBuf<uint16_t> k, v;
  explicit Feed(const Data& d) : k(d.k.size()), v(d.v.size()) {
    k.upload(d.k);
    v.upload(d.v);
  }
};

// Decodes queued on st into one device buffer, read once st is done.
std::vector<std::vector<uint16_t>> decode_on(ssa_session* s, const Data& d, cudaStream_t st) {
  DevBuf<uint16_t> q(d.q.size()), out(std::size(kMethods) * kOut);
  q.upload(d.q);
  for (size_t i = 0; i < std::size(kMethods); ++i) {
    ssa_decode_params p = params(kMethods[i], 900, 3);
    p.stream = st;
    REQUIRE(ssa_decode(s, 0, q.p, out.p + i * kOut, &p, nullptr) == SSA_OK);
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  const std::vector<uint16_t> all = out.download(out.n);
  std::vector<std::vector<uint16_t>> outs;
  for (size_t i = 0; i < std::size(kMethods); ++i)
    outs.emplace_back(all.begin() + i * kOut, all.begin() + (i + 1) * kOut);
  return outs;
}

std::vector<std::vector<uint16_t>> decode_plain(ssa_session* s, const Data& d) {
  std::vector<std::vector<uint16_t>> outs;
  for (ssa_method m : kMethods) outs.push_back(decode(s, d, params(m, 900, 3), true));
  return outs;
}

// A session fed d[0, n) with plain appends, in the same chunks.
ssa_session* reference(ssa_runtime* gpu, const Data& d, const Feed& f, uint32_t n) {
  ssa_session* s = async_session(gpu);
  uint32_t at = 0;
  for (uint32_t c : chunks(d.n)) {
    const uint32_t m = std::min(c, n - at);
    if (m == 0) break;
    REQUIRE(ssa_session_append(s, 0, f.k.p + at * kRow, f.v.p + at * kRow, m) == SSA_OK);
    at += m;
  }
  return s;
}

// d[0, n) appended asynchronously on st, each append behind a held stream; the
// length is checked after each call, before the stream has run the append. On
// return the last append is still queued.
ssa_session* fed_async(ssa_runtime* gpu, const Data& d, const Feed& f, uint32_t n, cudaStream_t st) {
  ssa_session* s = async_session(gpu);
  uint32_t at = 0;
  for (uint32_t c : chunks(d.n)) {
    const uint32_t m = std::min(c, n - at);
    if (m == 0) break;
    hold_stream(st);
    const ssa_status r = ssa_session_append_async(s, 0, f.k.p + at * kRow, f.v.p + at * kRow, m, st);
    INFO(ssa_last_error_message());
    REQUIRE(r == SSA_OK);
    at += m;
    CHECK(ssa_session_length(s) == at);
  }
  CHECK(cudaStreamQuery(st) == cudaErrorNotReady);  // the call did not wait for the stream
  return s;
}

TEST_CASE("gpu backend: asynchronous appends equal plain ones, and decodes behind them on the stream read them") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(20000, 11);  // 20000 % 128 != 0: the last page is partly filled
  const Feed f(d);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  ssa_session* ref = reference(gpu, d, f, d.n);
  const auto want = decode_plain(ref, d);

  ssa_session* s = fed_async(gpu, d, f, d.n, st);
  CHECK(decode_on(s, d, st) == want);
  // On the legacy default stream too: ordered after the queued copies.
  CHECK(decode_plain(s, d) == want);
  ssa_session_destroy(s);

  // The library's later work on the session waits for the queued copies.
  const uint32_t part = d.n - 1000;
  SUBCASE("a fork appends into the last page the queued copy writes (copy-on-write)") {
    const Data one = make_data(1, 12);
    const Feed f1(one);
    ssa_session* want_fork = reference(gpu, d, f, d.n);
    REQUIRE(ssa_session_append(want_fork, 0, f1.k.p, f1.v.p, 1) == SSA_OK);
    s = fed_async(gpu, d, f, d.n, st);
    ssa_session* fork = nullptr;
    REQUIRE(ssa_session_fork(s, &fork) == SSA_OK);
    REQUIRE(ssa_session_append(fork, 0, f1.k.p, f1.v.p, 1) == SSA_OK);
    CHECK(decode_plain(fork, d) == decode_plain(want_fork, d));
    CHECK(decode_on(s, d, st) == want);
    ssa_session_destroy(fork);
    ssa_session_destroy(want_fork);
    ssa_session_destroy(s);
  }
  SUBCASE("save while the copies are queued, then load") {
    const std::string path = std::string(P_tmpdir) + "/ssa_gpu_async_" + std::to_string(getpid()) + ".ssa";
    s = fed_async(gpu, d, f, d.n, st);
    REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);
    ssa_session* loaded = nullptr;
    REQUIRE(ssa_session_load(gpu, path.c_str(), 0, &loaded) == SSA_OK);
    CHECK(decode_plain(loaded, d) == want);
    ssa_session_destroy(loaded);
    ssa_session_destroy(s);
    std::remove(path.c_str());
  }
  SUBCASE("truncate below the queued rows, append them again on another stream") {
    cudaStream_t other;
    REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
    s = fed_async(gpu, d, f, d.n, st);
    REQUIRE(ssa_session_truncate(s, part) == SSA_OK);
    REQUIRE(ssa_session_append_async(s, 0, f.k.p + part * kRow, f.v.p + part * kRow, d.n - part, other) ==
            SSA_OK);
    CHECK(decode_on(s, d, other) == want);
    ssa_session_destroy(s);
    cudaStreamDestroy(other);
  }
  SUBCASE("destroy while the copies are queued; the next session reuses the memory") {
    s = fed_async(gpu, d, f, d.n, st);
    ssa_session_destroy(s);
    ssa_session* again = reference(gpu, d, f, d.n);
    CHECK(decode_plain(again, d) == want);
    ssa_session_destroy(again);
  }
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  cudaStreamDestroy(st);
  ssa_session_destroy(ref);
  ssa_runtime_destroy(gpu);
}

// Tiered sessions (ssa_runtime_options.device_kv_budget): asynchronous appends
// write into pages that appends move between the device and the host tier, on
// the legacy default stream, behind the queued copies.
TEST_CASE("gpu backend: asynchronous appends into a tiered session equal plain ones untiered") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(20000, 17);
  const Feed f(d);
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  const uint64_t kv_bytes = uint64_t{d.n} * 2 * kRow * sizeof(uint16_t);
  o.device_kv_budget = kv_bytes / 5;  // about 80% of the pages on the host
  o.host_cache_bytes = o.device_kv_budget / 4;
  ssa_runtime* tiered = nullptr;
  REQUIRE(ssa_runtime_create(&o, &tiered) == SSA_OK);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  ssa_session* ref = reference(flat, d, f, d.n);
  const auto want = decode_plain(ref, d);

  ssa_session* s = fed_async(tiered, d, f, d.n, st);
  CHECK(decode_on(s, d, st) == want);
  CHECK(decode_plain(s, d) == want);
  ssa_decode_stats stats;
  ssa_decode_stats_init(&stats);
  (void)decode(s, d, params(SSA_METHOD_DENSE, 900, 3), true, &stats);
  CHECK(stats.rows_from_host > uint64_t{d.n} * kNq / 2);  // the tiers are in use
  // Truncate below the queued rows and append them again: pages come back to the device.
  const uint32_t part = d.n / 4;
  hold_stream(st);
  REQUIRE(ssa_session_append_async(s, 0, f.k.p, f.v.p, 1, st) == SSA_OK);
  REQUIRE(ssa_session_truncate(s, part) == SSA_OK);
  hold_stream(st);
  REQUIRE(ssa_session_append_async(s, 0, f.k.p + part * kRow, f.v.p + part * kRow, d.n - part, st) == SSA_OK);
  CHECK(decode_on(s, d, st) == want);
  // A fork appends into the last page while the source's copy is queued.
  const Data one = make_data(1, 18);
  const Feed f1(one);
  REQUIRE(ssa_session_append(ref, 0, f1.k.p, f1.v.p, 1) == SSA_OK);
  const auto want_more = decode_plain(ref, d);
  ssa_session* fork = nullptr;
  REQUIRE(ssa_session_fork(s, &fork) == SSA_OK);
  hold_stream(st);
  REQUIRE(ssa_session_append_async(fork, 0, f1.k.p, f1.v.p, 1, st) == SSA_OK);
  CHECK(decode_on(fork, d, st) == want_more);
  CHECK(decode_plain(s, d) == want);
  ssa_session_destroy(fork);
  ssa_session_destroy(s);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  cudaStreamDestroy(st);
  ssa_session_destroy(ref);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu backend: asynchronous append refuses bad arguments and changes nothing") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(300, 13);
  const Feed f(d);
  ssa_session* s = session(gpu, 0);
  REQUIRE(ssa_session_append(s, 0, f.k.p, f.v.p, 200) == SSA_OK);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(ssa_session_append_async(nullptr, 0, f.k.p, f.v.p, 1, st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_append_async(s, 0, nullptr, f.v.p, 1, st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_append_async(s, 1, f.k.p, f.v.p, 1, st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_append_async(s, 0, d.k.data(), d.v.data(), 1, st) == SSA_ERR_INVALID_ARGUMENT);  // host memory
  CHECK(std::string(ssa_last_error_message()).find("device") != std::string::npos);
  // A stream being captured into a graph: the append could not be replayed.
  REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(ssa_session_append_async(s, 0, f.k.p, f.v.p, 1, st) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ssa_last_error_message()).find("captured") != std::string::npos);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(st, &g) == cudaSuccess);
  if (g != nullptr) cudaGraphDestroy(g);
  CHECK(ssa_session_length(s) == 200);
  // n_tokens 0 is a no-op; then the session still takes the rest.
  CHECK(ssa_session_append_async(s, 0, f.k.p, f.v.p, 0, st) == SSA_OK);
  REQUIRE(ssa_session_append_async(s, 0, f.k.p + 200 * kRow, f.v.p + 200 * kRow, 100, st) == SSA_OK);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  ssa_session* ref = session(gpu, 0);
  REQUIRE(ssa_session_append(ref, 0, f.k.p, f.v.p, 300) == SSA_OK);
  CHECK(decode_plain(s, d) == decode_plain(ref, d));
  ssa_session_destroy(ref);
  // Host K/V (SSA_SESSION_HOST_POINTERS): the stream may still be writing them,
  // so the append waits for it, then appends as ssa_session_append.
  ssa_session* h = session(gpu, SSA_SESSION_HOST_POINTERS);
  hold_stream(st);
  REQUIRE(ssa_session_append_async(h, 0, d.k.data(), d.v.data(), 300, st) == SSA_OK);
  CHECK(cudaStreamQuery(st) == cudaSuccess);
  CHECK(ssa_session_length(h) == 300);
  ssa_session_destroy(h);
  ssa_session_destroy(s);
  cudaStreamDestroy(st);
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
