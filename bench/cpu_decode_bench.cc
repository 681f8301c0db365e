// CPU decode benchmark: dense and every method at sparsity 10/20/50/100x, for the
// paper's head config (16 q, 4 KV, d 256, f16) and Llama-3.1-8B's (32 q, 8 KV,
// d 128, bf16), batch 1, contexts growing 64K -> 256K -> 1M in one session per
// config. Reports medians, ratios against our dense decode measured in the same
// run, the CPU time of the same decodes (the work apart from waiting for a core on
// a shared machine), the stage split, the machine's memcpy and read bandwidth and
// the cost of a fork. Group selection (docs/GROUP_SELECTION.md) runs for the methods that take it.
//
//   cpu_decode_bench [--contexts 65536,262144,1048576] [--reps 5] [--configs paper,llama]
//                    [--sparsities 10,20,50,100] [--methods ssa,pq_topk,...]
//                    [--proxy pq|opq|pq4|opq4|qpq|qpq4]   (16 bytes per token per KV head)
//                    [--group off,mixture,mean_query]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "bench_workload.h"
#include "decode/decode.h"
#include "ssa.h"

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
// CPU seconds of every thread of the process: on a machine shared with other
// work, the work a decode did, apart from the time it waited for a core.
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

using ssa_bench::median;

double copy_bandwidth_gbs() {
  const size_t bytes = size_t{1} << 29;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const double t0 = now_s();
    memcpy(b.data(), a.data(), bytes);
    best = std::min(best, now_s() - t0);
    a[i] = b[bytes - 1 - i];
  }
  return 2.0 * bytes / best / 1e9;  // read + write
}

// Bytes per second that `threads` threads read from one buffer much larger than
// the caches (the dense decode's access pattern: a pure forward read), best of 5.
double read_bandwidth_gbs(int threads) {
  const size_t bytes = size_t{1} << 30, words = bytes / 8;
  std::vector<uint64_t> a(words);
  for (size_t i = 0; i < words; ++i) a[i] = i;
  std::vector<uint64_t> sums(threads);
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t b = words / threads * t, e = t + 1 == threads ? words : words / threads * (t + 1);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = b; i + 4 <= e; i += 4) {
          s0 += a[i];
          s1 += a[i + 1];
          s2 += a[i + 2];
          s3 += a[i + 3];
        }
        sums[t] = s0 + s1 + s2 + s3;
      });
    }
    for (auto& th : pool) th.join();
    best = std::min(best, now_s() - t0);
  }
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  if (total == 1) printf("#\n");  // keeps the sums live
  return bytes / best / 1e9;
}

using ssa_bench::method_name;

const char* group_name(uint32_t g) {
  return g == SSA_GROUP_MIXTURE ? "mixture" : g == SSA_GROUP_MEAN_QUERY ? "mean_query" : "off";
}

bool listed(const std::string& list, const char* name) {
  const std::string l = "," + list + ",";
  return l.find("," + std::string(name) + ",") != std::string::npos;
}

using ssa_bench::check;

// The proxy of the sessions (--proxy), at 16 bytes per token per KV head: 8-bit
// codes over 16 subspaces, or 4-bit codes over 32.
struct ProxyChoice {
  const char* name;
  ssa_proxy proxy;
  uint32_t subspaces, centroids;
  bool query_aware;
};
constexpr ProxyChoice kProxies[] = {
    {"pq", SSA_PROXY_PQ, 16, 256, false},    {"opq", SSA_PROXY_OPQ, 16, 256, false},
    {"pq4", SSA_PROXY_PQ4, 32, 16, false},   {"opq4", SSA_PROXY_OPQ4, 32, 16, false},
    {"qpq", SSA_PROXY_QPQ, 16, 256, true},   {"qpq4", SSA_PROXY_QPQ4, 32, 16, true},
};

const ProxyChoice* find_proxy(const char* name) {
  for (const ProxyChoice& p : kProxies)
    if (!strcmp(p.name, name)) return &p;
  return nullptr;
}

// Queries a query-aware index learns from before it trains: n fresh queries of
// the workload (not the one measured: a generator of the same topics whose
// first query, the measured one's twin, is skipped).
void observe_queries(ssa_session* s, const ssa_bench::Shape& c, uint32_t n) {
  ssa_bench::StructuredKv obs(c.nkv, c.d, 42);
  obs.query(c.nq);
  std::vector<uint8_t> qs;
  for (uint32_t i = 0; i < n; ++i) {
    const auto q = obs.query(c.nq);
    const size_t at = qs.size();
    qs.resize(at + q.size() * 2);
    for (size_t j = 0; j < q.size(); ++j) ssa::store_from_f32(qs.data() + at, static_cast<ssa::DType>(c.dtype), j, q[j]);
  }
  check(ssa_session_observe_queries(s, 0, qs.data(), n), "observe queries");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> contexts = {65536, 262144, 1048576};
  int reps = 5;
  std::string configs = "paper,llama";
  std::string method_list = "oracle_topk,pq_topk,hybrid_uniform,sampling,ssa,ssa_adaptive";
  std::string group_list = "off,mixture,mean_query";
  std::vector<float> sparsities = {10, 20, 50, 100};
  const ProxyChoice* proxy = &kProxies[0];
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--proxy")) {
      proxy = find_proxy(argv[i + 1]);
      if (proxy == nullptr) {
        fprintf(stderr, "--proxy: one of pq, opq, pq4, opq4, qpq, qpq4\n");
        return 2;
      }
    }
    if (!strcmp(argv[i], "--contexts")) {
      contexts = ssa_bench::parse_u64_list(argv[i + 1]);
    } else if (!strcmp(argv[i], "--reps")) {
      reps = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--configs")) {
      configs = argv[i + 1];
    } else if (!strcmp(argv[i], "--methods")) {
      method_list = argv[i + 1];
    } else if (!strcmp(argv[i], "--group")) {
      group_list = argv[i + 1];
    } else if (!strcmp(argv[i], "--sparsities")) {
      sparsities.clear();
      for (uint64_t x : ssa_bench::parse_u64_list(argv[i + 1])) sparsities.push_back(static_cast<float>(x));
    }
  }
  const double copy_gbs = copy_bandwidth_gbs();
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(nullptr, &rt), "runtime");
  const int threads = ssa_runtime_num_threads(rt);
  const double read_gbs = read_bandwidth_gbs(threads);
  printf("# CPU decode benchmark\n\nthreads: %d, memcpy bandwidth (read+write): %.1f GB/s, read bandwidth "
         "(%d threads): %.1f GB/s, reps: %d (median)\n\n",
         threads, copy_gbs, threads, read_gbs, reps);

  const auto& all = ssa_bench::kCpuShapes;
  const ssa_method methods[] = {SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                                SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE};
  const uint32_t groups[] = {SSA_GROUP_OFF, SSA_GROUP_MIXTURE, SSA_GROUP_MEAN_QUERY};

  for (const ssa_bench::Shape& c : all) {
    if (!ssa_bench::wants_shape(configs, c)) continue;
    ssa_session_config cfg = ssa_test::make_config(1, c.nq, c.nkv, c.d, c.dtype);
    cfg.proxy = proxy->proxy;
    cfg.pq_subspaces = proxy->subspaces;
    cfg.pq_centroids = proxy->centroids;
    ssa_session* s = nullptr;
    check(ssa_session_create(rt, &cfg, &s), "session");
    if (proxy->query_aware) observe_queries(s, c, 64);
    ssa_bench::StructuredKv gen(c.nkv, c.d, 42);
    const auto qf = gen.query(c.nq);
    std::vector<uint8_t> qb(qf.size() * 2), out(qf.size() * 2);
    for (size_t i = 0; i < qf.size(); ++i) ssa::store_from_f32(qb.data(), static_cast<ssa::DType>(c.dtype), i, qf[i]);
    std::vector<uint8_t> K, V;
    uint64_t have = 0;
    printf("## %s, proxy %s (%u x %u)\n\n", c.name, proxy->name, proxy->subspaces, proxy->centroids);
    printf("| N | method | group | sparsity | median ms | vs dense | CPU ms | CPU vs dense | rows read/head | eff. GB/s | scoring | heavy | sampling | attention |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (uint64_t N : contexts) {
      const double t_app = now_s();
      while (have < N) {
        const uint64_t n = std::min<uint64_t>(65536, N - have);
        gen.next(n, static_cast<ssa::DType>(c.dtype), &K, &V);
        check(ssa_session_append(s, 0, K.data(), V.data(), n), "append");
        have += n;
      }
      const double append_s = now_s() - t_app;
      const double kv_bytes = double(N) * c.nkv * c.d * 2 * 2;
      // Median wall seconds; *cpu receives the median CPU seconds.
      auto run = [&](ssa_method m, uint32_t group, float sparsity, ssa::DecodeProfile* prof,
                     ssa_decode_stats* st, double* cpu) {
        ssa_decode_params p;
        ssa_decode_params_init(&p);
        p.method = m;
        p.group_selection = group;
        p.sparsity = sparsity;
        std::vector<double> times, cpus;
        for (int r = 0; r < reps + 1; ++r) {
          p.step = r;
          ssa::DecodeProfile one;
          ssa_decode_stats_init(st);
          const double t0 = now_s(), c0 = cpu_s();
          absl::Status status = ssa::decode(*s, 0, qb.data(), out.data(), p, st, nullptr, &one);
          const double t = now_s() - t0, c = cpu_s() - c0;
          if (!status.ok()) {
            fprintf(stderr, "decode: %s\n", std::string(status.message()).c_str());
            exit(1);
          }
          if (r == 0) continue;  // warm-up
          times.push_back(t);
          cpus.push_back(c);
          prof->scoring += one.scoring;
          prof->heavy += one.heavy;
          prof->sampling += one.sampling;
          prof->attention += one.attention;
        }
        *cpu = median(cpus);
        return median(times);
      };
      ssa::DecodeProfile dprof;
      ssa_decode_stats st;
      double dense_cpu = 0.0, cpu = 0.0;
      const double dense_s = run(SSA_METHOD_DENSE, SSA_GROUP_OFF, 1, &dprof, &st, &dense_cpu);
      printf("| %llu | dense | | 1 | %.2f | 1.00 | %.2f | 1.00 | %llu | %.1f | | | | |\n", (unsigned long long)N,
             dense_s * 1e3, dense_cpu * 1e3, (unsigned long long)N, kv_bytes / dense_s / 1e9);
      for (float sp : sparsities) {
        for (ssa_method m : methods) {
          if (!listed(method_list, method_name(m))) continue;
          for (uint32_t group : groups) {
            // Group selection is for the methods that sample or rank proxy scores.
            if (!listed(group_list, group_name(group))) continue;
            if (group != SSA_GROUP_OFF && (m == SSA_METHOD_ORACLE_TOPK || c.nq == c.nkv)) continue;
            ssa::DecodeProfile prof;
            const double t = run(m, group, sp, &prof, &st, &cpu);
            const double total = prof.scoring + prof.heavy + prof.sampling + prof.attention;
            const double rows = double(st.tokens_read) / c.nq;
            const double bytes = rows * c.nq / (c.nq / c.nkv) * c.d * 2 * 2 + double(N) * c.nkv * 16;
            printf("| %llu | %s | %s | %.0f | %.2f | %.2fx | %.2f | %.2fx | %.0f | %.1f | %.0f%% | %.0f%% | %.0f%% | %.0f%% |\n",
                   (unsigned long long)N, method_name(m), group_name(group), sp, t * 1e3, dense_s / t, cpu * 1e3,
                   dense_cpu / cpu, rows,
                   bytes / t / 1e9, 100 * prof.scoring / total, 100 * prof.heavy / total,
                   100 * prof.sampling / total, 100 * prof.attention / total);
          }
        }
      }
      const double t_fork = now_s();
      ssa_session* f = nullptr;
      check(ssa_session_fork(s, &f), "fork");
      const double fork_s = now_s() - t_fork;
      ssa_session_destroy(f);
      printf("\nN = %llu: dense reads %.2f GB at %.1f GB/s = %.0f%% of memcpy bandwidth (%.0f%% of the read "
             "bandwidth); fork %.3f ms; append+index up to %llu tokens (this step) %.1f s\n\n",
             (unsigned long long)N, kv_bytes / 1e9, kv_bytes / dense_s / 1e9, 100 * kv_bytes / dense_s / 1e9 / copy_gbs,
             100 * kv_bytes / dense_s / 1e9 / read_gbs, fork_s * 1e3, (unsigned long long)N, append_s);
      fflush(stdout);
    }
    ssa_session_destroy(s);
  }
  ssa_runtime_destroy(rt);
  return 0;
}
