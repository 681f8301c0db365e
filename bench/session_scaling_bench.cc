// Multi-session thread scaling: K independent sessions on one runtime, T caller
// threads each decoding its own session (SSA at 50x by default), for T = 1, 2,
// ... up to --max-threads. Reports decodes/s, the median decode time and the
// scaling against T = 1. This is the serving shape (many agents, one library):
// it shows whether sessions really decode independently or contend on shared
// state (runtime, page pools, allocator, memory bandwidth).
//
// By default the runtime has one thread, so each decode runs on its caller's
// thread alone and T is the whole parallelism; --runtime-threads N shares an
// N-thread pool between the callers instead.
//
//   session_scaling_bench [--max-threads 16] [--context 65536] [--sparsity 50]
//                         [--seconds 3] [--runtime-threads 1] [--sessions K]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "bench_workload.h"
#include "ssa.h"

namespace {

using Clock = std::chrono::steady_clock;

// The paper's head configuration (16 q heads, 4 KV heads, head dim 256, fp16).
constexpr uint32_t kNq = 16, kNkv = 4, kD = 256;
constexpr ssa_dtype kType = SSA_DTYPE_F16;

using ssa_bench::check;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

struct Session {
  ssa_session* s = nullptr;
  std::vector<uint8_t> q, out;
};

// Builds one session of `context` tokens with its own data and query; the PQ
// index trains automatically during the appends.
void build(ssa_runtime* rt, uint64_t context, uint64_t seed, Session* out) {
  ssa_session_config cfg = ssa_test::make_config(1, kNq, kNkv, kD, kType);
  check(ssa_session_create(rt, &cfg, &out->s), "session create");
  ssa_bench::StructuredKv gen(kNkv, kD, seed);
  std::vector<uint8_t> K, V;
  for (uint64_t have = 0; have < context;) {
    const uint64_t n = std::min<uint64_t>(65536, context - have);
    gen.next(n, static_cast<ssa::DType>(kType), &K, &V);
    check(ssa_session_append(out->s, 0, K.data(), V.data(), n), "append");
    have += n;
  }
  const std::vector<float> qf = gen.query(kNq);
  out->q.resize(qf.size() * 2);
  out->out.resize(qf.size() * 2);
  for (size_t i = 0; i < qf.size(); ++i) ssa::store_from_f32(out->q.data(), ssa::DType::kF16, i, qf[i]);
}

struct Point {
  double rate = 0, median_ms = 0;
};

// T threads decode sessions 0..T-1 for `seconds` after one warm-up decode each.
Point measure(std::vector<Session>& sessions, int T, float sparsity, double seconds) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<double> rates(T);
  std::vector<std::vector<double>> times(T);
  std::vector<std::thread> threads;
  for (int t = 0; t < T; ++t) {
    threads.emplace_back([&, t] {
      Session& s = sessions[t];
      ssa_decode_params p;
      ssa_decode_params_init(&p);
      p.method = SSA_METHOD_SSA;
      p.sparsity = sparsity;
      p.seed = 1 + t;
      check(ssa_decode(s.s, 0, s.q.data(), s.out.data(), &p, nullptr), "warm-up decode");
      ++ready;
      while (!go.load()) std::this_thread::yield();
      const auto t0 = Clock::now();
      auto last = t0;
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        p.step = ++n;
        check(ssa_decode(s.s, 0, s.q.data(), s.out.data(), &p, nullptr), "decode");
        const auto now = Clock::now();
        times[t].push_back(std::chrono::duration<double>(now - last).count());
        last = now;
      }
      rates[t] = n / std::chrono::duration<double>(last - t0).count();
    });
  }
  while (ready.load() < T) std::this_thread::yield();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : threads) th.join();
  Point pt;
  std::vector<double> all;
  for (int t = 0; t < T; ++t) {
    pt.rate += rates[t];
    all.insert(all.end(), times[t].begin(), times[t].end());
  }
  std::sort(all.begin(), all.end());
  pt.median_ms = all.empty() ? 0 : all[all.size() / 2] * 1e3;
  return pt;
}

}  // namespace

int main(int argc, char** argv) {
  int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t context = 65536;
  float sparsity = 50;
  double seconds = 3;
  int runtime_threads = 1, n_sessions = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--max-threads")) max_threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--context")) context = strtoull(argv[i + 1], nullptr, 10);
    else if (!strcmp(argv[i], "--sparsity")) sparsity = static_cast<float>(atof(argv[i + 1]));
    else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--runtime-threads")) runtime_threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--sessions")) n_sessions = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (max_threads < 1 || context == 0 || runtime_threads < 1) {
    fprintf(stderr, "--max-threads, --context and --runtime-threads must be >= 1\n");
    return 2;
  }
  if (n_sessions < max_threads) n_sessions = max_threads;  // one per decoding thread at least

  const ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CPU, runtime_threads);
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(&o, &rt), "runtime");

  // Sessions are built in parallel (each builder trains its own index).
  const auto t_build = Clock::now();
  std::vector<Session> sessions(n_sessions);
  {
    const int builders = std::min<int>(n_sessions, std::max(1u, std::thread::hardware_concurrency()));
    std::atomic<int> next{0};
    std::vector<std::thread> pool;
    for (int b = 0; b < builders; ++b) {
      pool.emplace_back([&] {
        for (int i; (i = next++) < n_sessions;) build(rt, context, 1000 + i, &sessions[i]);
      });
    }
    for (auto& th : pool) th.join();
  }
  const double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();

  printf("# Multi-session decode scaling\n\n");
  printf("CPU: %s, %u hardware threads; runtime threads: %d; sessions: %d x %llu tokens "
         "(16q/4kv/d256/f16, %.2f GiB of K/V each); SSA at %.0fx; %.1f s per point; setup %.1f s\n\n",
         cpu_model().c_str(), std::thread::hardware_concurrency(), runtime_threads, n_sessions,
         static_cast<unsigned long long>(context), context * kNkv * kD * 2.0 * 2 / (1u << 30), sparsity,
         seconds, build_s);
  printf("| threads T | decodes/s | per thread | median ms/decode | scaling vs T=1 | efficiency |\n");
  printf("|---|---|---|---|---|---|\n");
  double base = 0;
  for (int T = 1; T <= max_threads; ++T) {
    const Point pt = measure(sessions, T, sparsity, seconds);
    if (T == 1) base = pt.rate;
    printf("| %d | %.1f | %.1f | %.2f | %.2fx | %.0f%% |\n", T, pt.rate, pt.rate / T, pt.median_ms,
           pt.rate / base, 100 * pt.rate / base / T);
    fflush(stdout);
  }
  for (Session& s : sessions) ssa_session_destroy(s.s);
  ssa_runtime_destroy(rt);
  return 0;
}
