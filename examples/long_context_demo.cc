// The main example: an agent session with a long structured history. It appends
// the history layer by layer, then answers decode queries with dense attention
// and with Stratified Sparse Attention, and prints the error of SSA against
// dense, the rows each read and the speedup. Uses only the public C API.
//
//   long_context_demo [n_tokens] [sparsity]     (defaults: 131072 50)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <vector>

#include "ssa.h"
#include "support/structured_context.h"

namespace {

void check(ssa_status st, const char* what) {
  if (st != SSA_OK) {
    fprintf(stderr, "%s failed: %s: %s\n", what, ssa_status_string(st), ssa_last_error_message());
    exit(1);
  }
}

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 131072;
  const float sparsity = argc > 2 ? static_cast<float>(atof(argv[2])) : 50.0f;
  const uint32_t n_layers = 2, nq = 16, nkv = 4, d = 128;

  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(nullptr, &rt), "ssa_runtime_create");  // AUTO backend
  printf("libssa %s, backend %s, %d CPU threads\n", ssa_version_string(),
         ssa_runtime_backend(rt) == SSA_BACKEND_CUDA ? "cuda" : "cpu", ssa_runtime_num_threads(rt));

  ssa_session_config cfg;
  ssa_session_config_init(&cfg);
  cfg.n_layers = n_layers;
  cfg.n_q_heads = nq;
  cfg.n_kv_heads = nkv;
  cfg.head_dim = d;
  cfg.kv_dtype = SSA_DTYPE_F32;
  cfg.flags = SSA_SESSION_HOST_POINTERS;  // this program's arrays live in host memory
  ssa_session* s = nullptr;
  check(ssa_session_create(rt, &cfg, &s), "ssa_session_create");

  // The history: clustered keys, topic bursts, an attention sink (f32 here so the
  // example needs no half-precision conversion).
  printf("building a %llu-token history (%u layers, %u q heads, %u kv heads, d %u)...\n",
         (unsigned long long)n, n_layers, nq, nkv, d);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ssa_test::StructuredContext> ctx;
  for (uint32_t l = 0; l < n_layers; ++l) {
    ssa_test::StructuredOptions o;
    o.seed = 100 + l;
    ctx.push_back(ssa_test::make_structured_context(n, nkv, nq, d, o));
    // Append in agent-sized turns of 4096 tokens; the PQ index follows.
    for (uint64_t t = 0; t < n; t += 4096) {
      const uint64_t m = n - t < 4096 ? n - t : 4096;
      check(ssa_session_append(s, l, &ctx[l].K[t * nkv * d], &ctx[l].V[t * nkv * d], m),
            "ssa_session_append");
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  printf("session holds %llu tokens per layer (%.1f s to generate, append and index)\n\n",
         (unsigned long long)ssa_session_length(s), seconds(t0, t1));

  std::vector<float> dense(nq * d), sparse(nq * d);
  printf("%-6s %-10s %12s %12s %10s %10s\n", "layer", "method", "rows/head", "time ms", "speedup", "rel.err");
  for (uint32_t l = 0; l < n_layers; ++l) {
    ssa_decode_params p;
    ssa_decode_params_init(&p);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    p.method = SSA_METHOD_DENSE;
    check(ssa_decode(s, l, ctx[l].q.data(), dense.data(), &p, nullptr), "warm-up");
    auto a = std::chrono::steady_clock::now();
    check(ssa_decode(s, l, ctx[l].q.data(), dense.data(), &p, &st), "dense decode");
    const double t_dense = seconds(a, std::chrono::steady_clock::now());
    printf("%-6u %-10s %12.0f %12.2f %10s %10s\n", l, "dense", double(st.tokens_read) / nq, t_dense * 1e3,
           "1.00x", "0");
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA}) {
      p.method = m;
      p.sparsity = sparsity;
      p.step = 1;
      check(ssa_decode(s, l, ctx[l].q.data(), sparse.data(), &p, nullptr), "warm-up");
      a = std::chrono::steady_clock::now();
      check(ssa_decode(s, l, ctx[l].q.data(), sparse.data(), &p, &st), "sparse decode");
      const double t = seconds(a, std::chrono::steady_clock::now());
      double num = 0, den = 0;
      for (size_t i = 0; i < sparse.size(); ++i) {
        num += (sparse[i] - dense[i]) * (sparse[i] - dense[i]);
        den += dense[i] * dense[i];
      }
      printf("%-6u %-10s %12.0f %12.2f %9.2fx %10.4f\n", l, m == SSA_METHOD_SSA ? "ssa" : "pq_topk",
             double(st.tokens_read) / nq, t * 1e3, t_dense / t, sqrt(num / den));
    }
  }

  // Agent rollback and branching: fork the session, continue one branch.
  ssa_session* branch = nullptr;
  const auto f0 = std::chrono::steady_clock::now();
  check(ssa_session_fork(s, &branch), "ssa_session_fork");
  const auto f1 = std::chrono::steady_clock::now();
  check(ssa_session_truncate(branch, n / 2), "ssa_session_truncate");
  printf("\nfork of the %llu-token session: %.3f ms (pages shared copy-on-write); "
         "branch truncated to %llu tokens, original still %llu\n",
         (unsigned long long)n, seconds(f0, f1) * 1e3, (unsigned long long)ssa_session_length(branch),
         (unsigned long long)ssa_session_length(s));
  ssa_session_destroy(branch);
  ssa_session_destroy(s);
  ssa_runtime_destroy(rt);
  return 0;
}
