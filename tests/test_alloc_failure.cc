// Allocation failure at every point of runtime and session create, append,
// fork, update_index and snapshot load, through the C API: the n-th allocation
// fails, for n = 1, 2, ... until the call gets through. Each failure must give
// SSA_ERR_OUT_OF_MEMORY with a message, write no out-parameter and leave every
// existing session bitwise as it was (checked by decoding). This program links
// tests/support/failing_new.cc, so every operator new can fail, not only page
// allocations; under ASan a leak on any error path fails it as well.
#include <doctest/doctest.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "alloc.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

constexpr uint32_t kD = 32, kNq = 4, kNkv = 2, kLayers = 2;

// Small pages and a small index: many pages and training rounds per call, each
// call quick, so a loop over every allocation stays fast.
ssa_session_config config() {
  ssa_session_config c = make_config(kLayers, kNq, kNkv, kD, SSA_DTYPE_F16);
  c.page_tokens = 16;
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  c.index_min_tokens = 64;
  c.index_regrow_factor = 2.0f;
  c.index_train_sample = 256;
  c.index_iterations = 2;
  return c;
}

const StructuredContext& context() {
  static const StructuredContext ctx = make_structured_context(1200, kNkv, kNq, kD);
  return ctx;
}

void append_rows(ssa_session* s, uint32_t layer, size_t t0, size_t t1) {
  const auto& c = context();
  const std::vector<float> k(c.K.begin() + t0 * kNkv * kD, c.K.begin() + t1 * kNkv * kD);
  const std::vector<float> v(c.V.begin() + t0 * kNkv * kD, c.V.begin() + t1 * kNkv * kD);
  append_f32(s, layer, k, v, t1 - t0, SSA_DTYPE_F16);
}

// Everything a caller can observe of a session: layer lengths, and each layer's
// output under an exact method and under SSA (which reads the PQ index) with a
// fixed seed and step. Every layer must already hold an index, else the SSA
// decode would train one and change the session while observing it.
struct Observed {
  std::vector<uint64_t> lengths;
  std::vector<std::vector<uint8_t>> outputs;
  bool operator==(const Observed&) const = default;
};

Observed observe(ssa_session* s) {
  Observed o;
  const std::vector<uint8_t> q = encode(context().q, SSA_DTYPE_F16);
  for (uint32_t l = 0; l < kLayers; ++l) {
    o.lengths.push_back(ssa_session_layer_length(s, l));
    for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA}) {
      ssa_decode_params p = params(m, 0, 4.0f);
      p.n_sink = p.n_local = 8;
      p.seed = 7;
      p.step = 3;
      std::vector<uint8_t> out(q.size());
      SSA_CHECK_OK(ssa_decode(s, l, q.data(), out.data(), &p, nullptr));
      o.outputs.push_back(std::move(out));
    }
  }
  return o;
}

// A session with both layers indexed (trained at 200 tokens) and a partial last
// page, plus a fork that shares all its pages: an append to either must copy.
struct Scene {
  RuntimePtr rt = make_runtime(2);  // two threads: failures also hit pool workers
  SessionPtr s, fork;
  Scene() {
    s = make_session(rt.get(), config());
    for (uint32_t l = 0; l < kLayers; ++l) append_rows(s.get(), l, 0, 200);
    ssa_session* f = nullptr;
    SSA_CHECK_OK(ssa_session_fork(s.get(), &f));
    fork.reset(f);
  }
};

// A sentinel for out-parameters: a failing call must leave it alone.
ssa_session* const kUnwritten = reinterpret_cast<ssa_session*>(uintptr_t{0x5e55});

struct Counts {
  std::vector<std::pair<std::string, int>> by_call;
  int total = 0;
  void add(const std::string& what, int points) {
    by_call.emplace_back(what, points);
    total += points;
  }
};

Counts& counts() {
  static Counts c;
  return c;
}

// Runs `call` with its n-th allocation failing (and with `sticky`, every later
// one too: memory stays exhausted, so error paths that allocate are caught),
// for n = 1, 2, ... until the call makes fewer than n allocations and succeeds.
// After each injected failure: SSA_ERR_OUT_OF_MEMORY, a message, and whatever
// `unchanged` checks. Returns the number of failures injected (fault points).
int fault_loop(const std::string& what, bool sticky, const std::function<ssa_status()>& call,
               const std::function<void()>& unchanged) {
  int points = 0;
  for (uint64_t n = 1; n < 100000; ++n) {
    const uint64_t before = ssa::alloc_calls_made();
    ssa::set_alloc_failure_countdown(n, sticky);
    const ssa_status st = call();
    const uint64_t made = ssa::alloc_calls_made() - before;
    ssa::set_alloc_failure_countdown(0, false);
    CAPTURE(what);
    CAPTURE(sticky);
    CAPTURE(n);
    if (made < n) {
      CHECK_MESSAGE(st == SSA_OK, ssa_status_string(st), ": ", ssa_last_error_message());
      counts().add(what + (sticky ? " (sticky)" : ""), points);
      return points;
    }
    ++points;
    CHECK_MESSAGE(st == SSA_ERR_OUT_OF_MEMORY, ssa_status_string(st), ": ", ssa_last_error_message());
    CHECK(ssa_last_error_message()[0] != '\0');
    unchanged();
  }
  FAIL("the call never got through");
  return points;
}

}  // namespace

TEST_CASE("allocation failures in runtime and session create leave no object behind") {
  for (bool sticky : {false, true}) {
    Scene scene;
    const Observed before = observe(scene.s.get());
    ssa_runtime_options o;
    ssa_runtime_options_init(&o);
    o.backend = SSA_BACKEND_CPU;
    o.num_threads = 3;
    ssa_runtime* rt = nullptr;
    const int rt_points = fault_loop(
        "runtime create", sticky,
        [&] {
          rt = reinterpret_cast<ssa_runtime*>(kUnwritten);
          return ssa_runtime_create(&o, &rt);
        },
        [&] { CHECK(rt == reinterpret_cast<ssa_runtime*>(kUnwritten)); });
    ssa_runtime_destroy(rt);
    CHECK(rt_points >= 3);  // the runtime, the pool, worker threads

    const ssa_session_config cfg = config();
    ssa_session* made = nullptr;
    const int points = fault_loop(
        "session create", sticky,
        [&] {
          made = kUnwritten;
          return ssa_session_create(scene.rt.get(), &cfg, &made);
        },
        [&] {
          CHECK(made == kUnwritten);
          CHECK(observe(scene.s.get()) == before);
        });
    REQUIRE(made != kUnwritten);
    CHECK(ssa_session_length(made) == 0);
    ssa_session_destroy(made);
    CHECK(points >= 3);  // the session, its page pools, its layers
  }
}

TEST_CASE("allocation failures in append leave the session and its forks unchanged") {
  for (bool sticky : {false, true}) {
    // Retraining append: layer 0 grows 200 -> 460 (>= 2x), so the call copies
    // the shared partial page, adds pages, trains and re-encodes.
    {
      Scene scene;
      const Observed s_before = observe(scene.s.get()), f_before = observe(scene.fork.get());
      const auto& c = context();
      const std::vector<uint8_t> k = encode({c.K.begin() + 200 * kNkv * kD, c.K.begin() + 460 * kNkv * kD},
                                            SSA_DTYPE_F16);
      const std::vector<uint8_t> v = encode({c.V.begin() + 200 * kNkv * kD, c.V.begin() + 460 * kNkv * kD},
                                            SSA_DTYPE_F16);
      const int points = fault_loop(
          "append (retrains)", sticky,
          [&] { return ssa_session_append(scene.s.get(), 0, k.data(), v.data(), 260); },
          [&] {
            CHECK(observe(scene.s.get()) == s_before);
            CHECK(observe(scene.fork.get()) == f_before);
          });
      CHECK(points >= 10);
      CHECK(ssa_session_layer_length(scene.s.get(), 0) == 460);
      CHECK(observe(scene.fork.get()) == f_before);
    }
    // Encoding append: 5 tokens into the shared partial page, codes encoded
    // with the current codebooks (no retraining).
    {
      Scene scene;
      const Observed s_before = observe(scene.s.get()), f_before = observe(scene.fork.get());
      const auto& c = context();
      const std::vector<uint8_t> k = encode({c.K.begin() + 200 * kNkv * kD, c.K.begin() + 205 * kNkv * kD},
                                            SSA_DTYPE_F16);
      const std::vector<uint8_t> v = encode({c.V.begin() + 200 * kNkv * kD, c.V.begin() + 205 * kNkv * kD},
                                            SSA_DTYPE_F16);
      const int points = fault_loop(
          "append (encodes)", sticky,
          [&] { return ssa_session_append(scene.fork.get(), 1, k.data(), v.data(), 5); },
          [&] {
            CHECK(observe(scene.s.get()) == s_before);
            CHECK(observe(scene.fork.get()) == f_before);
          });
      CHECK(points >= 3);  // copies of the shared KV and code pages
      CHECK(ssa_session_layer_length(scene.fork.get(), 1) == 205);
      CHECK(observe(scene.s.get()) == s_before);
    }
  }
}

TEST_CASE("allocation failures in fork leave the source unchanged and return nothing") {
  for (bool sticky : {false, true}) {
    Scene scene;
    const Observed before = observe(scene.s.get());
    ssa_session* out = nullptr;
    const int points = fault_loop(
        "fork", sticky,
        [&] {
          out = kUnwritten;
          return ssa_session_fork(scene.s.get(), &out);
        },
        [&] {
          CHECK(out == kUnwritten);
          CHECK(observe(scene.s.get()) == before);
        });
    REQUIRE(out != kUnwritten);
    SessionPtr fork(out);
    CHECK(observe(fork.get()) == before);
    CHECK(points >= 2);
  }
}

TEST_CASE("allocation failures in update_index keep the old index") {
  for (bool sticky : {false, true}) {
    Scene scene;
    // 200 -> 300 tokens: below the regrow factor, so codes of the new tokens use
    // the codebooks trained at 200 and a retrain gives different SSA outputs.
    append_rows(scene.s.get(), 0, 200, 300);
    append_rows(scene.s.get(), 1, 200, 300);
    const Observed before = observe(scene.s.get());
    const int points = fault_loop(
        "update_index", sticky, [&] { return ssa_session_update_index(scene.s.get()); },
        [&] { CHECK(observe(scene.s.get()) == before); });
    const Observed after = observe(scene.s.get());
    CHECK(after.lengths == before.lengths);
    CHECK(after.outputs[0] == before.outputs[0]);  // dense: the keys did not change
    CHECK(after.outputs[1] != before.outputs[1]);  // SSA: the new index is in use
    CHECK(points >= 10);
  }
}

TEST_CASE("allocation failures in snapshot load return no session") {
  Scene scene;
  append_rows(scene.s.get(), 0, 200, 230);  // layers of different lengths
  const Observed before = observe(scene.s.get());
  char dir[] = "/tmp/ssa_alloc_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/s.snap";
  SSA_CHECK_OK(ssa_session_save(scene.s.get(), path.c_str()));
  for (bool sticky : {false, true}) {
    for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP}) {
      ssa_session* out = nullptr;
      const int points = fault_loop(
          "load flags " + std::to_string(flags), sticky,
          [&] {
            out = kUnwritten;
            return ssa_session_load(scene.rt.get(), path.c_str(), flags, &out);
          },
          [&] {
            CHECK(out == kUnwritten);
            CHECK(observe(scene.s.get()) == before);
          });
      REQUIRE(out != kUnwritten);
      SessionPtr loaded(out);
      CHECK(observe(loaded.get()) == before);
      CHECK(points >= 10);
    }
    // The checked load enters the library through another file's boundary.
    const ssa_session_config expected = config();
    ssa_session* out = nullptr;
    const int points = fault_loop(
        "load_checked", sticky,
        [&] {
          out = kUnwritten;
          return ssa_session_load_checked(scene.rt.get(), path.c_str(), 0, &expected, &out);
        },
        [&] { CHECK(out == kUnwritten); });
    REQUIRE(out != kUnwritten);
    SessionPtr loaded(out);
    CHECK(observe(loaded.get()) == before);
    CHECK(points >= 10);
  }
  unlink(path.c_str());
  rmdir(dir);
}

// Last (doctest runs test cases in file order): the summary CI prints.
TEST_CASE("allocation failures in a sharded decode write nothing, then it equals the unsharded decode") {
  // Two shards of 8192 tokens: failures hit the shards' threads, their
  // collectives and the pool workers they use.
  const StructuredContext ctx = make_structured_context(8192 + 900, kNkv, kNq, kD);
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 2);
  const int32_t devices[] = {0, 1};
  o.devices = devices;
  o.n_devices = 2;
  o.shard_tokens = 8192;
  ssa_runtime* r = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &r));
  RuntimePtr sharded_rt(r), plain_rt = make_runtime(2);
  SessionPtr sharded = make_session(sharded_rt.get(), config()), plain = make_session(plain_rt.get(), config());
  for (ssa_session* s : {sharded.get(), plain.get()}) {
    append_f32(s, 0, ctx.K, ctx.V, ctx.n, SSA_DTYPE_F16);
    SSA_CHECK_OK(ssa_session_update_index(s));
  }
  const std::vector<uint8_t> q = encode(ctx.q, SSA_DTYPE_F16);
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA_ADAPTIVE}) {
    ssa_decode_params p = params(m, 0, 20.0f);
    p.group_selection = m == SSA_METHOD_DENSE ? SSA_GROUP_OFF : SSA_GROUP_MIXTURE;
    p.seed = 7;  // the two runtimes' default seeds differ
    p.step = 5;
    std::vector<uint8_t> want(q.size()), out(q.size(), 0xC3);
    SSA_CHECK_OK(ssa_decode(plain.get(), 0, q.data(), want.data(), &p, nullptr));
    CAPTURE(m);
    for (bool sticky : {false, true}) {
      std::fill(out.begin(), out.end(), 0xC3);
      fault_loop(std::string("sharded decode ") + std::to_string(m), sticky,
                 [&] { return ssa_decode(sharded.get(), 0, q.data(), out.data(), &p, nullptr); },
                 [&] {
                   CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xC3; }));
                   CHECK(ssa_session_layer_length(sharded.get(), 0) == ctx.n);
                 });
      CHECK(out == want);
    }
  }
}

TEST_CASE("allocation fault points exercised") {
  std::string line;
  for (const auto& [what, points] : counts().by_call) line += " " + what + ": " + std::to_string(points) + ";";
  printf("allocation fault points exercised: %d in total;%s\n", counts().total, line.c_str());
  fflush(stdout);
  CHECK(counts().total >= 200);
}
