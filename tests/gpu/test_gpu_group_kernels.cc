// Group selection (docs/GROUP_SELECTION.md) in the CUDA decode kernels, against
// float64 references and the CPU's own selection code computed here on the host:
// one selection row per KV head, scored by the group's mean query or by the
// mixture of its q heads' proxy softmaxes; its heavy set, samples and pi; every q
// head's estimator over the shared rows; a group of one head bitwise the per-head
// decode; a group budget over every candidate dense; and Monte Carlo checks that
// every head's Horvitz-Thompson numerator and denominator are unbiased.
// Failures print the method, proposal, KV/q head and the counts involved.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/water_filling.h"
#include "decode/decode_plan.h"
#include "lib/cuda/method_plan.h"
#include "select/group_proposal.h"
#include "select/radix_topk.h"
#include "select/selection.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

using cuda::DecodeBatch;
using cuda::RowState;

const char* proposal_name(uint32_t g) {
  return g == SSA_GROUP_MIXTURE ? "mixture" : g == SSA_GROUP_MEAN_QUERY ? "mean_query" : "off";
}

struct GroupRun {
  DecodeBatch b;
  Decoder dec;
  DevBuf<uint8_t> out;
  ssa_decode_params p;
  DecodePlan plan;
  uint64_t k_group = 0;  // the selection row's budget (G k' with group selection)
};

// One decode of layer t with p.group_selection = group, planned as the CUDA
// backend plans it (lib/cuda/launch_set.cc).
void setup(GroupRun& r, const TestLayer& t, ssa_method method, uint32_t group, uint32_t budget, float h,
           uint32_t sink, uint32_t local, uint64_t step) {
  ssa_decode_params_init(&r.p);
  r.p.method = method;
  r.p.budget = budget;
  r.p.heavy_fraction = h;
  r.p.n_sink = sink;
  r.p.n_local = local;
  r.p.step = step;
  r.p.seed = 1234;
  r.p.group_selection = group;
  r.plan = plan_decode(t.n, r.p);
  const uint32_t G = t.L.group_size();
  r.k_group = cuda::selection_budget(r.plan, r.p, G);
  r.b = DecodeBatch{};
  r.b.shape = shape_of(t.L);
  r.b.n_items = 1;
  const bool dense = r.plan.dense || cuda::group_reads_all(r.plan, r.p, G);
  cuda::set_method(dense ? SSA_METHOD_DENSE : method, &r.b);
  if (!dense) cuda::set_group(r.p, G, &r.b);
  r.b.pi_min = r.p.pi_min;
  r.b.seed = r.p.seed;
  r.b.step = step;
  r.b.layer = 3;
  const size_t out_bytes = size_t{t.L.n_q_heads} * t.L.row_bytes();
  if (r.out.n < out_bytes) r.out = DevBuf<uint8_t>(out_bytes);
  CUDA_OK(cudaMemset(r.out.p, 0xff, out_bytes));  // poison: NaN in every dtype
  r.b.items[0] = item_of(t, r.out.p);
  cuda::plan_item(r.plan, r.p, G, &r.b.items[0]);
}

std::vector<float> run(GroupRun& r, const TestLayer& t) {
  CUDA_OK(r.dec.run(&r.b));
  CUDA_OK(cudaDeviceSynchronize());
  const size_t count = size_t{t.L.n_q_heads} * t.L.head_dim;
  return decode_out(t.L.dtype, r.out.download(count * t.L.elem_bytes()), count);
}

std::vector<uint8_t> run_raw(GroupRun& r, const TestLayer& t) {
  CUDA_OK(r.dec.run(&r.b));
  CUDA_OK(cudaDeviceSynchronize());
  return r.out.download(size_t{t.L.n_q_heads} * t.L.row_bytes());
}

// Selection row sh of the (single) item: state, scores, lists and log pi.
struct SelRow {
  RowState st;
  std::vector<float> scores;  // n_tokens
  std::vector<uint32_t> heavy, sampled;
  std::vector<float> log_pi;  // of each sample
};

SelRow fetch(const GroupRun& r, uint32_t sh) {
  const cuda::DecodeItem& it = r.b.items[0];
  REQUIRE_MESSAGE(sh < r.dec.plan.rows, "selection row ", sh, " of ", r.dec.plan.rows);
  SelRow v;
  CUDA_OK(cudaMemcpy(&v.st, r.dec.ws.rows + sh, sizeof(RowState), cudaMemcpyDeviceToHost));
  v.scores.resize(it.n_tokens);
  CUDA_OK(cudaMemcpy(v.scores.data(), r.dec.ws.scores + it.score_base + size_t{sh} * it.n_pad,
                     it.n_tokens * sizeof(float), cudaMemcpyDeviceToHost));
  const size_t sel = it.select_base + size_t{sh} * it.select_cap;
  REQUIRE_MESSAGE(v.st.n_heavy <= it.select_cap, "n_heavy ", v.st.n_heavy, " > select_cap ", it.select_cap);
  REQUIRE_MESSAGE(v.st.n_unique <= it.select_cap, "n_unique ", v.st.n_unique, " > select_cap ", it.select_cap);
  v.heavy.resize(v.st.n_heavy);
  if (v.st.n_heavy)
    CUDA_OK(cudaMemcpy(v.heavy.data(), r.dec.ws.heavy + sel, v.st.n_heavy * 4, cudaMemcpyDeviceToHost));
  v.sampled.resize(v.st.n_unique);
  v.log_pi.resize(v.st.n_unique);
  if (v.st.n_unique) {
    CUDA_OK(cudaMemcpy(v.sampled.data(), r.dec.ws.uniq_sorted + sel, v.st.n_unique * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(v.log_pi.data(), r.dec.ws.log_pi + sel, v.st.n_unique * 4, cudaMemcpyDeviceToHost));
  }
  return v;
}

// The group's mean query in float64, from the queries as the kernels scale them.
std::vector<double> mean_q(const TestLayer& t, uint32_t kvh) {
  const uint32_t G = t.L.group_size(), d = t.L.head_dim;
  std::vector<double> m(d, 0.0);
  for (uint32_t g = 0; g < G; ++g) {
    const auto q = scaled_q(t, kvh * G + g);
    for (uint32_t j = 0; j < d; ++j) m[j] += q[j] / G;
  }
  return m;
}

// Float64 proposal logits of KV head kvh's selection row (candidates only; -inf
// elsewhere): the mean query's proxy, or the mixture of the group's proxy softmaxes.
std::vector<double> proposal_ref(const TestLayer& t, const DecodePlan& plan, uint32_t kvh, uint32_t group,
                                 bool exact) {
  const uint32_t G = t.L.group_size();
  std::vector<double> out(t.n, -INFINITY);
  auto logit = [&](uint32_t h, uint32_t i, const std::vector<double>& q) {
    return exact ? exact_logit(t, h, i, q) : pq_logit(t, h, i, q);
  };
  if (group == SSA_GROUP_MEAN_QUERY || G == 1) {
    const std::vector<double> q = G == 1 ? scaled_q(t, kvh) : mean_q(t, kvh);
    for (uint64_t i = plan.sink_end; i < plan.local_begin; ++i) out[i] = logit(kvh * G, i, q);
    return out;
  }
  std::vector<double> mix(t.n, 0.0);
  for (uint32_t g = 0; g < G; ++g) {
    const uint32_t h = kvh * G + g;
    const auto q = scaled_q(t, h);
    std::vector<double> s(t.n);
    double mx = -INFINITY, z = 0;
    for (uint64_t i = plan.sink_end; i < plan.local_begin; ++i) mx = std::max(mx, s[i] = logit(h, i, q));
    for (uint64_t i = plan.sink_end; i < plan.local_begin; ++i) z += exp(s[i] - mx);
    for (uint64_t i = plan.sink_end; i < plan.local_begin; ++i) mix[i] += exp(s[i] - mx) / z;
  }
  for (uint64_t i = plan.sink_end; i < plan.local_begin; ++i) out[i] = log(mix[i]);
  return out;
}

uint32_t bad_scores(const std::vector<float>& got, const std::vector<double>& ref, const DecodePlan& plan,
                    double tol, double* worst) {
  uint32_t bad = 0;
  *worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool cand = i >= plan.sink_end && i < plan.local_begin;
    if (!cand) {
      bad += got[i] != -INFINITY;
      continue;
    }
    const double e = fabs(got[i] - ref[i]) / (1 + fabs(ref[i]));
    *worst = std::max(*worst, e);
    bad += e > tol;
  }
  return bad;
}

TEST_CASE("gpu group selection: one selection row per KV head, scored by the mean query or the mixture") {
  SSA_GPU_TEST_OR_SKIP();
  for (uint32_t G : {1u, 4u, 8u}) {
    TestLayer t;
    build_layer(t, 2 * G, 2, 128, DType::kF16, 9000, 128, 16, 256, 31 + G);
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK}) {
      for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
        GroupRun r;
        setup(r, t, m, group, 300, 0.4f, 100, 60, 0);
        INFO("G ", G, " method ", m, " proposal ", proposal_name(group));
        REQUIRE(r.b.proxy != cuda::Proxy::kNone);
        run(r, t);
        CHECK(r.dec.plan.rows == t.L.n_kv_heads);  // the selection buffers: KV-head rows
        CHECK(r.dec.plan.attn_rows == t.L.n_q_heads);
        for (uint32_t kvh = 0; kvh < t.L.n_kv_heads; ++kvh) {
          const SelRow v = fetch(r, kvh);
          const auto ref = proposal_ref(t, r.plan, kvh, group, m == SSA_METHOD_ORACLE_TOPK);
          double worst = 0;
          const uint32_t bad = bad_scores(v.scores, ref, r.plan, 2e-4, &worst);
          INFO("KV head ", kvh, " worst relative score error ", worst);
          CHECK(bad == 0);
          CHECK(v.heavy.size() == r.k_group);
        }
      }
    }
    // The mean query's lookup tables are the CPU's (mean_query, then products and
    // sums rounded one by one), bit for bit.
    if (G > 1) {
      GroupRun r;
      setup(r, t, SSA_METHOD_PQ_TOPK, SSA_GROUP_MEAN_QUERY, 300, 0.4f, 100, 60, 0);
      run(r, t);
      const uint32_t d = t.L.head_dim, M = t.L.pq_subspaces, K = t.L.pq_centroids, sub = d / M;
      const float scale = 1.0f / sqrtf(static_cast<float>(d));
      for (uint32_t kvh = 0; kvh < t.L.n_kv_heads; ++kvh) {
        std::vector<float> qf(size_t{G} * d), qm(d);
        for (size_t i = 0; i < qf.size(); ++i) qf[i] = t.q[size_t{kvh} * G * d + i] * scale;
        mean_query(qf.data(), G, d, qm.data());
        std::vector<float> lut(size_t{M} * K);
        CUDA_OK(cudaMemcpy(lut.data(), r.dec.ws.lut + size_t{kvh} * M * K, lut.size() * 4, cudaMemcpyDeviceToHost));
        uint32_t differ = 0, far = 0;
        for (uint32_t mm = 0; mm < M; ++mm)
          for (uint32_t c = 0; c < K; ++c) {
            const float* cen = t.books.data() + ((size_t{kvh} * M + mm) * K + c) * sub;
            float s = 0.0f;
            for (uint32_t j = 0; j < sub; ++j) s += qm[mm * sub + j] * cen[j];
            const float g = lut[size_t{c} * M + mm];  // one head a pass: [c][m]
            differ += g != s;
            far += fabsf(g - s) > 1e-6f * (1.f + fabsf(s));
          }
        INFO("G ", G, " KV head ", kvh, ": ", differ, " table entries differ from the CPU's in some bit");
        CHECK(far == 0);
        if (differ) MESSAGE("mean-query tables differ from the CPU's in the last bits: ", differ, " entries");
      }
    }
  }
}

// The selected set equals the top-k of the scores except among near-ties, and
// the CPU's radix top-k on the same scores (up to near-ties).
void check_topk(const std::vector<float>& scores, uint32_t begin, uint32_t end, const std::vector<uint32_t>& sel,
                size_t k) {
  REQUIRE_MESSAGE(sel.size() == k, "selected ", sel.size(), ", wanted ", k);
  std::set<uint32_t> s(sel.begin(), sel.end());
  REQUIRE(s.size() == k);
  CHECK(std::is_sorted(sel.begin(), sel.end()));
  if (k == 0) return;
  float lowest = INFINITY;
  for (uint32_t tok : sel) {
    REQUIRE(tok >= begin);
    REQUIRE(tok < end);
    lowest = std::min(lowest, scores[tok]);
  }
  const float slack = 1e-5f * (1.f + fabsf(lowest));
  uint32_t above = 0;
  for (uint32_t i = begin; i < end; ++i) above += !s.count(i) && scores[i] > lowest + slack;
  CHECK_MESSAGE(above == 0, above, " candidates above the lowest selected score were left out");
  std::vector<uint32_t> cpu;
  topk_indices(scores.data() + begin, end - begin, k, begin, &cpu);
  uint32_t differ = 0;
  for (uint32_t tok : cpu) differ += !s.count(tok) && fabsf(scores[tok] - lowest) > slack;
  CHECK_MESSAGE(differ == 0, differ, " of the CPU's top-k tokens are not selected");
}

// Structure of KV head kvh's selection and, for every q head of its group, the
// float64 estimator over the shared rows with float64 pi (from the selection
// row's scores) against the GPU output.
void check_group_row(const GroupRun& r, const TestLayer& t, uint32_t kvh, const std::vector<float>& got,
                     double tol) {
  const SelRow v = fetch(r, kvh);
  const uint32_t sink = r.plan.sink_end, lb = r.plan.local_begin, G = t.L.group_size();
  const ssa_method m = r.p.method;
  const uint64_t k = r.k_group;
  INFO("method ", m, " proposal ", proposal_name(r.p.group_selection), " KV head ", kvh, " k_g ", k, " |H| ",
       v.st.n_heavy, " m ", v.st.n_draws, " |S| ", v.sampled.size());
  if (m != SSA_METHOD_SSA_ADAPTIVE) {
    check_topk(v.scores, sink, lb, v.heavy, fixed_heavy_count(m, k, r.p.heavy_fraction));
  } else {
    float mx = -INFINITY;
    for (uint32_t i = sink; i < lb; ++i) mx = std::max(mx, v.scores[i]);
    double total = 0;
    for (uint32_t i = sink; i < lb; ++i) total += exp(static_cast<double>(v.scores[i]) - mx);
    std::vector<double> qs;
    for (uint32_t i = sink; i < lb; ++i) qs.push_back(exp(static_cast<double>(v.scores[i]) - mx) / total);
    std::sort(qs.rbegin(), qs.rend());
    qs.resize(k);
    const WaterFill wf = water_fill(qs.data(), qs.size(), 1.0, static_cast<double>(k));
    CHECK(std::abs(static_cast<long>(v.st.n_heavy) - static_cast<long>(wf.heavy)) <= 1);
    check_topk(v.scores, sink, lb, v.heavy, v.st.n_heavy);
  }
  const bool samples = m != SSA_METHOD_PQ_TOPK && m != SSA_METHOD_ORACLE_TOPK;
  CHECK(v.st.n_draws == (samples ? k - v.st.n_heavy : 0));
  std::set<uint32_t> heavy(v.heavy.begin(), v.heavy.end());
  CHECK(v.sampled.size() <= v.st.n_draws);
  if (samples) CHECK(!v.sampled.empty());
  for (size_t i = 0; i < v.sampled.size(); ++i) {
    CHECK(v.sampled[i] >= sink);
    CHECK(v.sampled[i] < lb);
    CHECK(!heavy.count(v.sampled[i]));
    if (i) CHECK(v.sampled[i] > v.sampled[i - 1]);
  }
  float mx = -INFINITY;
  for (uint32_t i = sink; i < lb; ++i) mx = std::max(mx, v.scores[i]);
  const bool uniform = m == SSA_METHOD_HYBRID_UNIFORM;
  double wr = 0;
  for (uint32_t i = sink; i < lb; ++i)
    if (!heavy.count(i)) wr += uniform ? 1.0 : exp(static_cast<double>(v.scores[i]) - mx);
  if (samples) CHECK(fabs(v.st.w_total / 274877906944.0 - wr) <= 1e-5 * wr);
  std::vector<uint32_t> toks;
  std::vector<double> lp;
  for (uint32_t i = 0; i < sink; ++i) toks.push_back(i), lp.push_back(0);
  for (uint32_t i = lb; i < t.n; ++i) toks.push_back(i), lp.push_back(0);
  for (uint32_t i : v.heavy) toks.push_back(i), lp.push_back(0);
  uint32_t bad_pi = 0;
  for (size_t s = 0; s < v.sampled.size(); ++s) {
    const uint32_t i = v.sampled[s];
    const double p = (uniform ? 1.0 : exp(static_cast<double>(v.scores[i]) - mx)) / wr;
    const double l = log(inclusion_probability(p, v.st.n_draws, r.p.pi_min));
    bad_pi += fabs(v.log_pi[s] - l) > 1e-4 * (1 + fabs(l));
    toks.push_back(i);
    lp.push_back(l);
  }
  CHECK_MESSAGE(bad_pi == 0, bad_pi, " samples' log pi differ from float64");
  // Every q head of the group reweights all of the shared rows.
  for (uint32_t g = 0; g < G; ++g) {
    const uint32_t h = kvh * G + g;
    const auto ref = attend_ref(t, h, toks, lp);
    const double e = rel_err(got, ref, size_t{h} * t.L.head_dim);
    INFO("q head ", h, " rel err against the float64 estimator ", e);
    CHECK(e <= tol);
  }
}

TEST_CASE("gpu group selection: the shared heavy set, samples and pi, and every head's estimator, match float64") {
  SSA_GPU_TEST_OR_SKIP();
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                         SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      for (uint32_t n : {6000u, 40000u}) {
        TestLayer t;
        build_layer(t, 8, 2, 128, DType::kF16, n, 256, 16, 64, n * 3 + m + 100 * group);
        GroupRun r;
        // 127 sink tokens: candidates off 16-byte alignment (the unaligned paths).
        setup(r, t, m, group, n / 20, 0.4f, n == 6000u ? 127 : 128, 128, 5);
        const auto got = run(r, t);
        for (uint32_t kvh = 0; kvh < t.L.n_kv_heads; ++kvh) check_group_row(r, t, kvh, got, 2e-3);
      }
    }
  }
}

// The mixture's selection-row logits are what the CPU's mixture_logits makes of
// the same per-head scores (the GPU's own scratch rows): the same operations,
// up to the rounding of exp.
TEST_CASE("gpu group selection: the mixture's logits are the CPU's mixture_logits of the heads' scores") {
  SSA_GPU_TEST_OR_SKIP();
  for (uint32_t G : {2u, 4u, 8u}) {
    TestLayer t;
    build_layer(t, 2 * G, 2, 64, DType::kBF16, 20000, 256, 8, 64, 700 + G);
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_ORACLE_TOPK}) {
      GroupRun r;
      setup(r, t, m, SSA_GROUP_MIXTURE, 1000, 0.4f, 64, 64, 1);
      REQUIRE(r.b.group == cuda::GroupProposal::kMixture);
      run(r, t);
      const cuda::DecodeItem& it = r.b.items[0];
      const uint32_t nc = static_cast<uint32_t>(r.plan.candidates());
      for (uint32_t kvh = 0; kvh < 2; ++kvh) {
        std::vector<std::vector<float>> hs(G, std::vector<float>(nc));
        std::vector<const float*> rows(G);
        for (uint32_t g = 0; g < G; ++g) {
          const size_t base = it.score_base * G + size_t{kvh * G + g} * it.n_pad + it.sink_end;
          CUDA_OK(cudaMemcpy(hs[g].data(), r.dec.ws.head_scores + base, nc * 4, cudaMemcpyDeviceToHost));
          rows[g] = hs[g].data();
        }
        std::vector<float> want(nc), head_max(G);
        std::vector<uint64_t> head_total(G);
        for (uint32_t g = 0; g < G; ++g) {
          head_max[g] = *std::max_element(hs[g].begin(), hs[g].end());
          head_total[g] = proposal_total(hs[g].data(), nc, head_max[g]);
        }
        mixture_logits(rows.data(), G, nc, head_max.data(), head_total.data(), want.data());
        const SelRow v = fetch(r, kvh);
        uint32_t bad = 0;
        double worst = 0;
        for (uint32_t j = 0; j < nc; ++j) {
          const double e = fabs(v.scores[it.sink_end + j] - want[j]) / (1 + fabs(want[j]));
          worst = std::max(worst, e);
          bad += e > 2e-6;
        }
        INFO("G ", G, " method ", m, " KV head ", kvh, " worst relative difference ", worst);
        CHECK(bad == 0);
        // The heavy set is the CPU's top-k of the CPU's logits (up to near-ties).
        std::vector<float> cpu_scores(t.n, -INFINITY);
        std::copy(want.begin(), want.end(), cpu_scores.begin() + it.sink_end);
        check_topk(cpu_scores, it.sink_end, it.local_begin, v.heavy,
                   fixed_heavy_count(m, r.k_group, r.p.heavy_fraction));
      }
    }
  }
}

TEST_CASE("gpu group selection: a group of one head decodes bitwise as per-head selection") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 2, 2, 128, DType::kF16, 30000, 256, 16, 64, 4321);
  for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                       SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    GroupRun off;
    setup(off, t, m, SSA_GROUP_OFF, 1500, 0.4f, 64, 64, 9);
    const auto want = run_raw(off, t);
    for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
      GroupRun g;
      setup(g, t, m, group, 1500, 0.4f, 64, 64, 9);
      INFO("method ", m, " proposal ", proposal_name(group));
      CHECK(g.b.grouped());
      const auto got = run_raw(g, t);
      CHECK(g.dec.plan.rows == off.dec.plan.rows);
      CHECK(g.dec.plan.total_bytes == off.dec.plan.total_bytes);
      CHECK(got == want);
      for (uint32_t h = 0; h < 2; ++h) {
        const SelRow a = fetch(off, h), b = fetch(g, h);
        INFO("head ", h, " |H| ", a.heavy.size(), "/", b.heavy.size(), " |S| ", a.sampled.size(), "/",
             b.sampled.size());
        CHECK(a.heavy == b.heavy);
        CHECK(a.sampled == b.sampled);
        CHECK(a.log_pi == b.log_pi);
        CHECK(a.scores == b.scores);
      }
    }
  }
}

TEST_CASE("gpu group selection: a group budget over every candidate, and budget >= N, are DENSE") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 8, 2, 128, DType::kF16, 5000, 256, 16, 64, 555);
  GroupRun dense;
  setup(dense, t, SSA_METHOD_DENSE, SSA_GROUP_OFF, 0, 0.4f, 64, 64, 0);
  const auto want = run_raw(dense, t);
  // Budget 1400: k' = 1272 per head, so the group's 4 k' covers the 4872
  // candidates where one head's k' does not; 5000 = N; 9000 > N.
  for (uint32_t budget : {1400u, 5000u, 9000u}) {
    for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
      for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                           SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
        GroupRun r;
        setup(r, t, m, group, budget, 0.4f, 64, 64, 2);
        INFO("budget ", budget, " method ", m, " proposal ", proposal_name(group));
        CHECK(r.b.proxy == cuda::Proxy::kNone);
        CHECK(run_raw(r, t) == want);
      }
    }
  }
  // Short of covering the group (4 x 1172 < 4872): sparse.
  GroupRun r;
  setup(r, t, SSA_METHOD_SSA, SSA_GROUP_MEAN_QUERY, 1300, 0.4f, 64, 64, 2);
  CHECK(r.b.proxy == cuda::Proxy::kPq);
  CHECK(run_raw(r, t) != want);
}

// Monte Carlo over steps: E[N^_j] = N_j and E[D^_j] = D_j for every q head j of
// the group (docs/GROUP_SELECTION.md), from the GPU's own read sets and log pi,
// over the candidates (the sink and local rows are exact in both).
TEST_CASE("gpu group selection: every head's numerator and denominator are unbiased (Monte Carlo)") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 4, 1, 64, DType::kF32, 3000, 64, 8, 32, 99, 1.0f);
  const uint32_t G = 4, d = 64, T = 1500;
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    for (ssa_method m : {SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      GroupRun r;
      setup(r, t, m, group, 200, 0.4f, 64, 64, 0);
      const uint32_t sink = r.plan.sink_end, lb = r.plan.local_begin;
      // Exact weights e_j(t) = exp(s_j(t) - c_j) of every candidate, per head.
      std::vector<std::vector<double>> e(G, std::vector<double>(t.n, 0.0));
      std::vector<double> D(G, 0.0), N(size_t{G} * d, 0.0);
      for (uint32_t j = 0; j < G; ++j) {
        const auto q = scaled_q(t, j);
        double c = -INFINITY;
        for (uint32_t i = sink; i < lb; ++i) c = std::max(c, e[j][i] = exact_logit(t, j, i, q));
        for (uint32_t i = sink; i < lb; ++i) {
          e[j][i] = exp(e[j][i] - c);
          D[j] += e[j][i];
          for (uint32_t x = 0; x < d; ++x) N[j * d + x] += e[j][i] * t.v[size_t{i} * d + x];
        }
      }
      std::vector<double> sd(G, 0.0), sd2(G, 0.0), sn(size_t{G} * d, 0.0), sn2(size_t{G} * d, 0.0);
      double draws = 0;
      for (uint32_t step = 0; step < T; ++step) {
        r.b.step = step;
        CUDA_OK(r.dec.run(&r.b));
        const SelRow v = fetch(r, 0);
        draws += v.sampled.size();
        for (uint32_t j = 0; j < G; ++j) {
          double dh = 0;
          std::vector<double> nh(d, 0.0);
          auto add = [&](uint32_t i, double w) {
            dh += w * e[j][i];
            for (uint32_t x = 0; x < d; ++x) nh[x] += w * e[j][i] * t.v[size_t{i} * d + x];
          };
          for (uint32_t i : v.heavy) add(i, 1.0);
          for (size_t s = 0; s < v.sampled.size(); ++s) add(v.sampled[s], exp(-static_cast<double>(v.log_pi[s])));
          sd[j] += dh;
          sd2[j] += dh * dh;
          for (uint32_t x = 0; x < d; ++x) {
            sn[j * d + x] += nh[x];
            sn2[j * d + x] += nh[x] * nh[x];
          }
        }
      }
      INFO("method ", m, " proposal ", proposal_name(group), " mean unique samples ", draws / T);
      CHECK(draws > 0);
      for (uint32_t j = 0; j < G; ++j) {
        const double md = sd[j] / T, se_d = sqrt(std::max(0.0, sd2[j] / T - md * md) / T);
        INFO("q head ", j, ": E[D^] ", md, " D ", D[j], " se ", se_d);
        CHECK(fabs(md - D[j]) <= 5 * se_d + 1e-3 * D[j]);
        uint32_t bad = 0;
        double worst_z = 0;
        for (uint32_t x = 0; x < d; ++x) {
          const double mn = sn[j * d + x] / T;
          const double se = sqrt(std::max(0.0, sn2[j * d + x] / T - mn * mn) / T);
          const double z = fabs(mn - N[j * d + x]) / (se + 1e-3 * D[j] / sqrt(double(d)));
          worst_z = std::max(worst_z, z);
          bad += z > 5;
        }
        INFO("q head ", j, ": largest |z| of E[N^] over the dims ", worst_z);
        CHECK(bad == 0);
      }
    }
  }
}

}  // namespace
}  // namespace ssa::gputest
