// Randomized stress of the header's thread-safety rules: threads x sessions x
// random operations (append, decode, decode_batch, fork, truncate, update_index,
// save, checkpoint, load, destroy) on one runtime, for a bounded time. Checks:
//  - every dense decode sees one whole committed state: its output equals,
//    bitwise, a reference decode at the length it reports (lengths only ever
//    change by whole appends and truncates, so a torn read shows);
//  - every other method gives finite outputs;
//  - a snapshot round trip decodes bitwise like the session it came from for
//    the same seed and step, and a save taken beside writers holds a committed
//    state of every layer;
//  - session_length is the minimum of the layer lengths.
// Environment: SSA_STRESS_SECONDS (default 3), SSA_STRESS_OPS (stop after this
// many operations; default no limit), SSA_STRESS_THREADS (4),
// SSA_STRESS_SESSIONS (3), SSA_STRESS_SEED (1). CI runs it under ThreadSanitizer.
#include <doctest/doctest.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

constexpr uint32_t kD = 32, kNq = 4, kNkv = 2, kLayers = 2;
constexpr uint64_t kStep = 16;     // every length is a multiple of it
constexpr uint64_t kMaxLen = 768;  // per layer
constexpr ssa_dtype kType = SSA_DTYPE_F16;

double env_number(const char* name, double fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? atof(v) : fallback;
}

ssa_session_config config() {
  ssa_session_config c = make_config(kLayers, kNq, kNkv, kD, kType);
  c.page_tokens = 16;
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  c.index_min_tokens = 128;  // automatic training (and retraining at 2x) happens
  c.index_regrow_factor = 2.0f;
  c.index_train_sample = 256;
  c.index_iterations = 2;
  return c;
}

enum Op {
  kDecode, kBatch, kAppend, kTruncate, kUpdateIndex, kFork, kDestroy, kSaveLoad,
  kRoundTrip, kCheckpoint, kLength, kOpCount
};
const char* const kOpNames[kOpCount] = {"decode", "decode_batch", "append", "truncate",
                                        "update_index", "fork", "destroy", "save+load",
                                        "snapshot round trip", "checkpoint", "length check"};
// Relative frequencies of the operations above.
const int kOpWeights[kOpCount] = {30, 10, 14, 5, 4, 8, 5, 4, 4, 3, 3};

// The fixed data every session holds a prefix of, per layer, and the dense
// output for every length a layer can have.
struct World {
  std::vector<uint8_t> k[kLayers], v[kLayers], q;
  std::vector<std::vector<uint8_t>> dense[kLayers];  // [layer][length / kStep]
  size_t row_bytes = size_t{kNkv} * kD * 2;
  RuntimePtr rt = make_runtime(2);

  World() {
    q = encode(make_structured_context(1, kNkv, kNq, kD).q, kType);
    auto ref = make_session(rt.get(), config());
    for (uint32_t l = 0; l < kLayers; ++l) {
      StructuredOptions o;
      o.seed = 100 + l;
      const StructuredContext c = make_structured_context(kMaxLen, kNkv, kNq, kD, o);
      k[l] = encode(c.K, kType);
      v[l] = encode(c.V, kType);
      dense[l].resize(kMaxLen / kStep + 1);
      for (uint64_t n = kStep; n <= kMaxLen; n += kStep) {
        append(ref.get(), l, n - kStep, kStep);
        dense[l][n / kStep] = decode(ref.get(), l, SSA_METHOD_DENSE, 0, 0, nullptr);
      }
    }
  }
  // Appends tokens [t0, t0 + n) of the layer's data.
  ssa_status append(ssa_session* s, uint32_t l, uint64_t t0, uint64_t n) const {
    return ssa_session_append(s, l, k[l].data() + t0 * row_bytes, v[l].data() + t0 * row_bytes, n);
  }
  std::vector<uint8_t> decode(ssa_session* s, uint32_t l, ssa_method m, uint64_t seed, uint64_t step,
                              ssa_decode_stats* st) const {
    ssa_decode_params p = params(m, 0, 4.0f);
    p.n_sink = p.n_local = 8;
    p.seed = seed;
    p.step = step;
    std::vector<uint8_t> out(q.size());
    SSA_CHECK_OK(ssa_decode(s, l, q.data(), out.data(), &p, st));
    return out;
  }
  // The dense output matches a committed length of the layer.
  bool committed(uint32_t l, uint64_t n, const std::vector<uint8_t>& out) const {
    return n % kStep == 0 && n >= kStep && n <= kMaxLen && dense[l][n / kStep] == out;
  }
  bool committed_any(uint32_t l, const std::vector<uint8_t>& out) const {
    for (const auto& d : dense[l])
      if (d == out) return true;
    return false;
  }
};

bool finite(const std::vector<uint8_t>& out) {
  for (float x : decode_bytes(out, kType, out.size() / 2))
    if (!std::isfinite(x)) return false;
  return true;
}

// A session every thread uses. The test's own mutex serialises only the test's
// appends and truncates of it, so that the rows appended are always the next
// rows of the fixed data (the contents stay a function of the lengths); the
// library's locking is what everything else relies on: decodes, forks, saves
// and index updates run beside those writers with no test lock.
struct Shared {
  SessionPtr s;
  std::mutex writer_mu;
};

struct Failures {
  std::atomic<int> count{0};
  std::mutex mu;
  std::vector<std::string> first;
  void add(const std::string& what) {
    ++count;
    std::lock_guard lock(mu);
    if (first.size() < 10) first.push_back(what);
  }
};

class Worker {
 public:
  Worker(const World& w, std::vector<Shared>& shared, Failures& f, const std::string& dir, int id,
         uint64_t seed)
      : w_(w), shared_(shared), fail_(f), rng_(seed),
        save_path_(dir + "/save" + std::to_string(id)), trip_path_(dir + "/trip" + std::to_string(id)),
        ckpt_path_(dir + "/ckpt" + std::to_string(id)) {}

  void run(Op op) {
    try {
      step(op);
    } catch (const std::exception& e) {  // SSA_CHECK_OK throws on an unexpected status
      fail_.add(std::string(kOpNames[op]) + ": " + e.what());
    }
  }

 private:
  uint64_t pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  Shared& any_shared() { return shared_[pick(shared_.size())]; }
  // A session this thread may decode: a shared one or one of its own.
  ssa_session* any_session(bool* own) {
    *own = !own_.empty() && pick(2) == 0;
    return *own ? own_[pick(own_.size())].get() : any_shared().s.get();
  }
  void keep(ssa_session* s) {
    if (own_.size() >= 4) own_.erase(own_.begin() + pick(own_.size()));  // destroys it
    own_.emplace_back(s);
  }
  void check(bool ok, const std::string& what) {
    if (!ok) fail_.add(what);
  }
  // Every layer of s holds a committed state (s is not changed meanwhile).
  void check_whole(ssa_session* s, const char* what) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const auto out = w_.decode(s, l, SSA_METHOD_DENSE, 0, 0, &st);
      check(st.context_tokens == ssa_session_layer_length(s, l) && w_.committed(l, st.context_tokens, out),
            std::string(what) + ": a layer does not hold a committed state");
    }
  }
  // Appends the next rows to a layer, or truncates when it is full.
  void grow(ssa_session* s) {
    const uint32_t l = static_cast<uint32_t>(pick(kLayers));
    const uint64_t len = ssa_session_layer_length(s, l);
    const uint64_t n = kStep * (1 + pick(4));
    if (len + n <= kMaxLen) {
      SSA_CHECK_OK(w_.append(s, l, len, n));
      check(ssa_session_layer_length(s, l) == len + n, "append: wrong layer length");
    } else {
      shrink(s);
    }
  }
  void shrink(ssa_session* s) {
    const uint64_t len = ssa_session_length(s);
    const uint64_t n = kStep * (1 + pick(len / kStep));  // 16..len: never empty
    SSA_CHECK_OK(ssa_session_truncate(s, n));
    check(ssa_session_length(s) == n, "truncate: wrong length");
  }

  void step(Op op) {
    switch (op) {
      case kDecode: {
        bool own = false;
        ssa_session* s = any_session(&own);
        const uint32_t l = static_cast<uint32_t>(pick(kLayers));
        const ssa_method m = kAllMethods[pick(std::size(kAllMethods))];
        ssa_decode_stats st;
        ssa_decode_stats_init(&st);
        const auto out = w_.decode(s, l, m, 1 + pick(1000), pick(1000), &st);
        check(st.context_tokens % kStep == 0, "decode: saw a length between two writes");
        if (m == SSA_METHOD_DENSE) {
          check(w_.committed(l, st.context_tokens, out), "dense decode: output of no committed state");
        } else {
          check(finite(out), "decode: non-finite output");
        }
        break;
      }
      case kBatch: {
        const size_t n = 1 + pick(4);
        const uint32_t l = static_cast<uint32_t>(pick(kLayers));
        const bool dense = pick(2) == 0;
        std::vector<ssa_decode_item> items(n);
        std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(w_.q.size()));
        std::vector<bool> own(n);
        for (size_t i = 0; i < n; ++i) {
          bool o = false;
          items[i] = {any_session(&o), w_.q.data(), outs[i].data()};
          own[i] = o;
        }
        ssa_decode_params p = params(dense ? SSA_METHOD_DENSE : SSA_METHOD_SSA, 0, 4.0f);
        p.n_sink = p.n_local = 8;
        p.step = pick(1000);
        SSA_CHECK_OK(ssa_decode_batch(items.data(), n, l, &p));
        for (size_t i = 0; i < n; ++i) {
          if (!dense) {
            check(finite(outs[i]), "decode_batch: non-finite output");
          } else if (own[i]) {  // its length is known: only this thread changes it
            check(w_.committed(l, ssa_session_layer_length(items[i].session, l), outs[i]),
                  "decode_batch: wrong output for an unchanging session");
          } else {
            check(w_.committed_any(l, outs[i]), "decode_batch: output of no committed state");
          }
        }
        break;
      }
      case kAppend:
      case kTruncate: {
        const bool mine = !own_.empty() && pick(3) == 0;
        if (mine) {
          ssa_session* s = own_[pick(own_.size())].get();
          op == kAppend ? grow(s) : shrink(s);
        } else {
          Shared& sh = any_shared();
          std::lock_guard lock(sh.writer_mu);
          op == kAppend ? grow(sh.s.get()) : shrink(sh.s.get());
        }
        break;
      }
      case kUpdateIndex:
        SSA_CHECK_OK(ssa_session_update_index(any_shared().s.get()));
        break;
      case kFork: {
        bool own = false;
        ssa_session* src = any_session(&own);
        ssa_session* f = nullptr;
        SSA_CHECK_OK(ssa_session_fork(src, &f));
        keep(f);
        check_whole(f, "fork");
        break;
      }
      case kDestroy:
        if (!own_.empty()) own_.erase(own_.begin() + pick(own_.size()));
        break;
      case kSaveLoad: {
        // Saved beside writers: the file holds one committed state per layer.
        SSA_CHECK_OK(ssa_session_save(any_shared().s.get(), save_path_.c_str()));
        ssa_session* back = nullptr;
        const uint32_t flags = pick(2) == 0 ? 0u : SSA_LOAD_MMAP;
        SSA_CHECK_OK(ssa_session_load(w_.rt.get(), save_path_.c_str(), flags, &back));
        keep(back);
        check_whole(back, "save beside writers, then load");
        break;
      }
      case kRoundTrip: {
        // A private fork (nothing changes it) against its own snapshot.
        ssa_session* f = nullptr;
        SSA_CHECK_OK(ssa_session_fork(any_shared().s.get(), &f));
        SessionPtr fork(f);
        SSA_CHECK_OK(ssa_session_save(f, trip_path_.c_str()));
        ssa_session* g = nullptr;
        SSA_CHECK_OK(ssa_session_load(w_.rt.get(), trip_path_.c_str(), SSA_LOAD_VERIFY, &g));
        SessionPtr loaded(g);
        const uint32_t l = static_cast<uint32_t>(pick(kLayers));
        const uint64_t seed = 1 + pick(1000), step = pick(1000);
        const ssa_method m = pick(2) == 0 ? SSA_METHOD_SSA : SSA_METHOD_SSA_ADAPTIVE;
        check(w_.decode(f, l, m, seed, step, nullptr) == w_.decode(g, l, m, seed, step, nullptr),
              "snapshot round trip: loaded session decodes differently");
        break;
      }
      case kCheckpoint: {
        SSA_CHECK_OK(ssa_session_checkpoint(any_shared().s.get(), ckpt_path_.c_str()));
        ssa_snapshot_info info;
        ssa_snapshot_info_init(&info);
        SSA_CHECK_OK(ssa_snapshot_inspect(ckpt_path_.c_str(), &info));
        check(info.length % kStep == 0 && info.max_layer_length <= kMaxLen,
              "checkpoint: a length between two writes");
        break;
      }
      case kLength: {
        Shared& sh = any_shared();
        std::lock_guard lock(sh.writer_mu);  // lengths hold still (update_index may run)
        uint64_t min = UINT64_MAX;
        for (uint32_t l = 0; l < kLayers; ++l) min = std::min(min, ssa_session_layer_length(sh.s.get(), l));
        check(ssa_session_length(sh.s.get()) == min, "session_length is not the minimum over layers");
        break;
      }
      default:
        break;
    }
  }

  const World& w_;
  std::vector<Shared>& shared_;
  Failures& fail_;
  std::mt19937_64 rng_;
  std::vector<SessionPtr> own_;  // forks and loaded sessions only this thread uses
  const std::string save_path_, trip_path_, ckpt_path_;
};

}  // namespace

TEST_CASE("stress: random operations from many threads on shared sessions") {
  const double seconds = env_number("SSA_STRESS_SECONDS", 3.0);
  const uint64_t max_ops = static_cast<uint64_t>(env_number("SSA_STRESS_OPS", 0));
  const int threads = std::max(1, static_cast<int>(env_number("SSA_STRESS_THREADS", 4)));
  const int n_sessions = std::max(1, static_cast<int>(env_number("SSA_STRESS_SESSIONS", 3)));
  const uint64_t seed = static_cast<uint64_t>(env_number("SSA_STRESS_SEED", 1));

  const World w;
  std::vector<Shared> shared(n_sessions);
  for (int i = 0; i < n_sessions; ++i) {
    shared[i].s = make_session(w.rt.get(), config());
    for (uint32_t l = 0; l < kLayers; ++l) SSA_CHECK_OK(w.append(shared[i].s.get(), l, 0, 64 + 64 * (i % 6)));
  }
  char dir_template[] = "/tmp/ssa_stress_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;

  Failures failures;
  std::atomic<uint64_t> counts[kOpCount] = {};
  std::atomic<uint64_t> total{0};
  std::atomic<bool> stop{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Worker worker(w, shared, failures, dir, t, seed * 1000003 + t);
      std::mt19937_64 rng(seed * 7919 + t);
      std::discrete_distribution<int> choose(std::begin(kOpWeights), std::end(kOpWeights));
      while (!stop.load(std::memory_order_relaxed)) {
        const Op op = static_cast<Op>(choose(rng));
        worker.run(op);
        counts[op].fetch_add(1, std::memory_order_relaxed);
        const uint64_t done = total.fetch_add(1, std::memory_order_relaxed) + 1;
        if ((max_ops != 0 && done >= max_ops) || std::chrono::steady_clock::now() >= deadline) stop = true;
      }
    });
  }
  for (auto& t : pool) t.join();
  std::filesystem::remove_all(dir);

  std::string line;
  for (int op = 0; op < kOpCount; ++op) {
    line += std::string(op == 0 ? "" : ", ") + kOpNames[op] + " " + std::to_string(counts[op].load());
  }
  printf("stress: %d threads x %d sessions, %.1f s limit, seed %llu: %llu operations (%s)\n", threads,
         n_sessions, seconds, static_cast<unsigned long long>(seed),
         static_cast<unsigned long long>(total.load()), line.c_str());
  fflush(stdout);
  for (const std::string& f : failures.first) FAIL_CHECK(f);
  CHECK(failures.count.load() == 0);
  // Each kind of operation ran, so each rule above was exercised (unless the
  // run was cut to a handful of operations on purpose).
  if (max_ops == 0 || max_ops >= 1000) {
    for (int op = 0; op < kOpCount; ++op) {
      CAPTURE(kOpNames[op]);
      CHECK(counts[op].load() > 0);
    }
  }
}
