// Selection per KV group against per-head selection on the CPU, side by side in
// one run: the structured workload (bench_workload.h), the paper's head config
// and Llama-3.1-8B's, sparsity 10/20/50x. Per method: decode time, relative L2
// error against dense (mean over query sets and heads, and that of the worst query
// head: each head's mean over query sets, the largest), and the distinct K/V
// rows read per KV head. Group selection is measured twice: at the same budget
// parameter (the same nominal rows, g * k' per KV head) and at equal distinct
// rows read (its budget set so that g * k' equals the per-head union's middle
// rows), which is the comparison at equal bytes.
//
//   group_selection_bench [--contexts 65536,262144] [--reps 3] [--queries 4] [--configs paper,llama]
// --reps 0 measures errors and rows only (no timing: for a loaded machine).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.h"
#include "bench_workload.h"
#include "decode/decode.h"
#include "ssa.h"

namespace {

using ssa_bench::check;
using ssa_bench::median;
using ssa_bench::now_us;

using ssa_bench::method_name;

const char* mode_name(uint32_t mode) {
  return mode == SSA_GROUP_OFF ? "per-head" : mode == SSA_GROUP_MIXTURE ? "group mixture" : "group mean-q";
}

struct Measure {
  double ms = 0, err = 0, rows = 0;  // median time; mean rel. error; distinct rows per KV head
  double worst = 0;                  // the largest of the query heads' mean rel. errors
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> contexts = {65536, 262144};
  int reps = 3, n_queries = 4;
  std::string configs = "paper,llama";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--contexts")) {
      contexts = ssa_bench::parse_u64_list(argv[i + 1]);
    } else if (!strcmp(argv[i], "--reps")) {
      reps = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--queries")) {
      n_queries = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--configs")) {
      configs = argv[i + 1];
    }
  }
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(nullptr, &rt), "runtime");
  printf("# Group selection vs per-head selection (CPU, structured workload)\n\nthreads: %d, reps: %d (median), "
         "query sets: %d\n\n", ssa_runtime_num_threads(rt), reps, n_queries);
  const auto& all = ssa_bench::kCpuShapes;
  const ssa_method methods[] = {SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                                SSA_METHOD_SSA_ADAPTIVE};
  const float sparsities[] = {10, 20, 50};
  for (const ssa_bench::Shape& c : all) {
    if (!ssa_bench::wants_shape(configs, c)) continue;
    const auto dt = static_cast<ssa::DType>(c.dtype);
    const uint32_t g = c.nq / c.nkv;
    const ssa_session_config cfg = ssa_test::make_config(1, c.nq, c.nkv, c.d, c.dtype);
    ssa_session* s = nullptr;
    check(ssa_session_create(rt, &cfg, &s), "session");
    ssa_bench::StructuredKv gen(c.nkv, c.d, 42);
    std::vector<std::vector<uint8_t>> qs;
    for (int i = 0; i < n_queries; ++i) {
      const auto qf = gen.query(c.nq);
      qs.emplace_back(qf.size() * 2);
      for (size_t j = 0; j < qf.size(); ++j) ssa::store_from_f32(qs.back().data(), dt, j, qf[j]);
    }
    const size_t width = size_t{c.nq} * c.d;
    std::vector<uint8_t> out(width * 2), K, V;
    uint64_t have = 0;
    printf("## %s\n\n", c.name);
    printf("| N | sparsity | method | selection | budget/head | distinct rows/KV head | rel. error | worst head "
           "| median ms | vs per-head |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (uint64_t N : contexts) {
      while (have < N) {
        const uint64_t n = std::min<uint64_t>(65536, N - have);
        gen.next(n, dt, &K, &V);
        check(ssa_session_append(s, 0, K.data(), V.data(), n), "append");
        have += n;
      }
      auto decode = [&](const ssa_decode_params& p, size_t qi, std::vector<ssa::HeadTrace>* tr) {
        absl::Status st = ssa::decode(*s, 0, qs[qi].data(), out.data(), p, nullptr, tr);
        if (!st.ok()) {
          fprintf(stderr, "decode: %s\n", std::string(st.message()).c_str());
          exit(1);
        }
        std::vector<float> o(width);
        for (size_t i = 0; i < width; ++i) o[i] = ssa::load_as_f32(out.data(), dt, i);
        return o;
      };
      const ssa_decode_params dense_p = ssa_test::params(SSA_METHOD_DENSE);
      std::vector<std::vector<float>> dense;
      for (int qi = 0; qi < n_queries; ++qi) dense.push_back(decode(dense_p, qi, nullptr));
      auto measure = [&](const ssa_decode_params& base) {
        Measure r;
        std::vector<double> times;
        ssa_decode_params p = base;
        std::vector<double> head_err(c.nq, 0.0);
        for (int qi = 0; qi < n_queries; ++qi) {
          p.step = qi;
          std::vector<ssa::HeadTrace> tr;
          const auto o = decode(p, qi, &tr);
          for (uint32_t h = 0; h < c.nq; ++h) {
            double e = 0, nrm = 0;
            for (uint32_t i = 0; i < c.d; ++i) {
              const double a = o[h * c.d + i], b = dense[qi][h * c.d + i];
              e += (a - b) * (a - b);
              nrm += b * b;
            }
            r.err += sqrt(e / nrm) / (double(c.nq) * n_queries);
            head_err[h] += sqrt(e / nrm) / n_queries;
          }
          for (uint32_t kv = 0; kv < c.nkv; ++kv) {
            std::vector<uint32_t> u;
            for (uint32_t j = 0; j < g; ++j) u.insert(u.end(), tr[kv * g + j].tokens.begin(), tr[kv * g + j].tokens.end());
            std::sort(u.begin(), u.end());
            r.rows += double(std::unique(u.begin(), u.end()) - u.begin()) / (double(c.nkv) * n_queries);
          }
          for (int rep = 0; reps > 0 && rep < reps + 1; ++rep) {
            const double t0 = now_us();
            decode(p, qi, nullptr);
            if (rep > 0) times.push_back(now_us() - t0);
          }
        }
        r.ms = median(times) / 1e3;
        r.worst = *std::max_element(head_err.begin(), head_err.end());
        return r;
      };
      for (float sp : sparsities) {
        for (ssa_method m : methods) {
          const ssa_decode_params p = ssa_test::params(m, 0, sp);
          const uint64_t budget = static_cast<uint64_t>(ceil(double(N) / sp));
          const Measure ph = measure(p);
          auto row = [&](const char* sel, uint64_t b, const Measure& r) {
            char ms[32] = "-", ratio[32] = "-";
            if (!isnan(r.ms)) {
              snprintf(ms, sizeof ms, "%.2f", r.ms);
              snprintf(ratio, sizeof ratio, "%.2fx", ph.ms / r.ms);
            }
            printf("| %llu | %.0f | %s | %s | %llu | %.0f | %.4f | %.4f | %s | %s |\n", (unsigned long long)N, sp,
                   method_name(m), sel, (unsigned long long)b, r.rows, r.err, r.worst, ms, ratio);
          };
          row(mode_name(SSA_GROUP_OFF), budget, ph);
          const uint64_t fixed = p.n_sink + p.n_local;
          // Equal distinct rows: the group's g * k' = the per-head union's middle rows.
          const uint64_t eq_budget = fixed + static_cast<uint64_t>(ceil((ph.rows - fixed) / g));
          for (uint32_t mode : {uint32_t(SSA_GROUP_MIXTURE), uint32_t(SSA_GROUP_MEAN_QUERY)}) {
            ssa_decode_params q = p;
            q.group_selection = mode;
            row(mode_name(mode), budget, measure(q));
            q.budget = static_cast<uint32_t>(eq_budget);
            const std::string label = std::string(mode_name(mode)) + ", equal rows";
            row(label.c_str(), eq_budget, measure(q));
          }
        }
      }
      printf("\n");
      fflush(stdout);
    }
    ssa_session_destroy(s);
  }
  ssa_runtime_destroy(rt);
  return 0;
}
