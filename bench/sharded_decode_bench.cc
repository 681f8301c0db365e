// Sharded CPU decode against the unsharded one: one session's content (built
// once, saved, and mapped by each runtime) decoded on runtimes of 1, 2 and 4
// in-process shards with the same worker threads. Every sharded output is
// checked bitwise against the unsharded one. On the CPU the shards share the
// same cores, so this measures what sharding costs (the ranks' threads, the
// extra passes of the global top-k and the collectives), not a speed-up.
//
//   sharded_decode_bench [--contexts 262144] [--shards 1,2,4] [--reps 5] [--configs paper,llama]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "bench_util.h"
#include "bench_workload.h"
#include "ssa.h"
#include "support/config.h"

int main(int argc, char** argv) {
  std::vector<uint64_t> contexts = {262144}, shards = {1, 2, 4};
  int reps = 5;
  std::string configs = "paper,llama";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--contexts")) contexts = ssa_bench::parse_u64_list(argv[i + 1]);
    if (!strcmp(argv[i], "--shards")) shards = ssa_bench::parse_u64_list(argv[i + 1]);
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--configs")) configs = argv[i + 1];
  }
  using ssa_bench::check;
  ssa_runtime* base = nullptr;
  check(ssa_runtime_create(nullptr, &base), "runtime");
  const int threads = ssa_runtime_num_threads(base);
  printf("# Sharded CPU decode\n\nthreads: %d, reps: %d (median), shards share the threads\n\n", threads, reps);
  const ssa_method methods[] = {SSA_METHOD_DENSE, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE};
  for (const ssa_bench::Shape& c : ssa_bench::kCpuShapes) {
    if (!ssa_bench::wants_shape(configs, c)) continue;
    printf("## %s\n\n| N | shards | method | median ms | vs 1 shard | bitwise |\n|---|---|---|---|---|---|\n", c.name);
    for (uint64_t N : contexts) {
      // The content, once.
      const ssa_session_config cfg = ssa_test::make_config(1, c.nq, c.nkv, c.d, c.dtype);
      ssa_session* s0 = nullptr;
      check(ssa_session_create(base, &cfg, &s0), "session");
      ssa_bench::StructuredKv gen(c.nkv, c.d, 42);
      std::vector<uint8_t> K, V;
      for (uint64_t have = 0; have < N;) {
        const uint64_t n = std::min<uint64_t>(65536, N - have);
        gen.next(n, static_cast<ssa::DType>(c.dtype), &K, &V);
        check(ssa_session_append(s0, 0, K.data(), V.data(), n), "append");
        have += n;
      }
      check(ssa_session_update_index(s0), "index");
      const std::string path = "/tmp/sharded_decode_bench_" + std::to_string(getpid()) + ".ssa";
      check(ssa_session_save(s0, path.c_str()), "save");
      ssa_session_destroy(s0);
      const auto qf = gen.query(c.nq);
      std::vector<uint8_t> qb(qf.size() * 2);
      for (size_t i = 0; i < qf.size(); ++i) ssa::store_from_f32(qb.data(), static_cast<ssa::DType>(c.dtype), i, qf[i]);
      std::vector<std::vector<uint8_t>> ref(4);
      std::vector<double> ref_ms(4);
      for (uint64_t S : shards) {
        ssa_runtime_options o;
        ssa_runtime_options_init(&o);
        o.backend = SSA_BACKEND_CPU;
        std::vector<int32_t> devs(S);
        for (uint64_t i = 0; i < S; ++i) devs[i] = static_cast<int32_t>(i);
        o.devices = devs.data();
        o.n_devices = static_cast<uint32_t>(S);
        // Even shards: ceil(N / S) rounded up to the 8192-token split.
        o.shard_tokens = ((N + S - 1) / S + 8191) / 8192 * 8192;
        ssa_runtime* rt = nullptr;
        check(ssa_runtime_create(&o, &rt), "sharded runtime");
        ssa_session* s = nullptr;
        check(ssa_session_load(rt, path.c_str(), SSA_LOAD_MMAP, &s), "load");
        for (size_t mi = 0; mi < 4; ++mi) {
          ssa_decode_params p;
          ssa_decode_params_init(&p);
          p.method = methods[mi];
          p.sparsity = 50.0f;
          std::vector<uint8_t> out(qb.size());
          std::vector<double> t;
          for (int r = 0; r <= reps; ++r) {
            p.step = 7;  // the same draws every rep: the outputs compare bitwise
            const double t0 = ssa_bench::now_us();
            check(ssa_decode(s, 0, qb.data(), out.data(), &p, nullptr), "decode");
            if (r > 0) t.push_back((ssa_bench::now_us() - t0) / 1e3);
          }
          const double ms = ssa_bench::median(t);
          if (S == shards[0]) {
            ref[mi] = out;
            ref_ms[mi] = ms;
          }
          printf("| %llu | %llu | %s | %.2f | %.2fx | %s |\n", (unsigned long long)N, (unsigned long long)S,
                 ssa_bench::method_name(methods[mi]), ms, ms / ref_ms[mi], out == ref[mi] ? "yes" : "NO");
          fflush(stdout);
        }
        ssa_session_destroy(s);
        ssa_runtime_destroy(rt);
      }
      remove(path.c_str());
    }
    printf("\n");
  }
  ssa_runtime_destroy(base);
  return 0;
}
