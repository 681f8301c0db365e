// The CUDA decode kernels against float64 references computed here on the host:
// dense split-K decode, PQ proxy scores with sink/local masking, radix top-k,
// three-level sampling (read-set rules, inclusion frequencies against pi), the
// sparse attention estimator, determinism, and CUDA graph capture and replay.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "common/water_filling.h"
#include "decode/decode_plan.h"
#include "support/gpu_layer.h"
#include "lib/cuda/method_plan.h"
#include "select/radix_topk.h"
#include "select/selection.h"

namespace ssa::gputest {
namespace {

using cuda::DecodeBatch;
using cuda::RowState;

struct Run {
  DecodeBatch b;
  Decoder dec;
  DevBuf<uint8_t> out;
  ssa_decode_params p;
  DecodePlan plan;
};

void params_init(ssa_decode_params* p) { ssa_decode_params_init(p); }

void setup_run(Run& r, const TestLayer& t, ssa_method method, uint32_t budget, float h,
               uint32_t sink, uint32_t local, uint64_t step) {
  ssa_decode_params_init(&r.p);
  r.p.method = method;
  r.p.budget = budget;
  r.p.heavy_fraction = h;
  r.p.n_sink = sink;
  r.p.n_local = local;
  r.p.step = step;
  r.p.seed = 1234;
  r.plan = plan_decode(t.n, r.p);
  r.b = DecodeBatch{};
  r.b.shape = shape_of(t.L);
  r.b.n_items = 1;
  cuda::set_method(method, &r.b);
  if (r.plan.dense) r.b.proxy = cuda::Proxy::kNone;
  r.b.pi_min = r.p.pi_min;
  r.b.seed = r.p.seed;
  r.b.step = step;
  r.b.layer = 3;
  const size_t out_bytes = size_t{t.L.n_q_heads} * t.L.row_bytes();
  if (r.out.n < out_bytes) r.out = DevBuf<uint8_t>(out_bytes);
  CUDA_OK(cudaMemset(r.out.p, 0xff, out_bytes));  // poison: NaN in every dtype
  r.b.items[0] = item_of(t, r.out.p);
  cuda::plan_item(r.plan, r.p, t.L.group_size(), &r.b.items[0]);
}

std::vector<float> run_and_fetch(Run& r, const TestLayer& t) {
  CUDA_OK(r.dec.run(&r.b));
  CUDA_OK(cudaDeviceSynchronize());
  const size_t count = size_t{t.L.n_q_heads} * t.L.head_dim;
  return decode_out(t.L.dtype, r.out.download(count * t.L.elem_bytes()), count);
}

double tolerance(DType dt) { return dt == DType::kF16 ? 1e-3 : dt == DType::kBF16 ? 8e-3 : 1e-5; }

const char* dtype_name(DType dt) { return dt == DType::kF16 ? "f16" : dt == DType::kBF16 ? "bf16" : "f32"; }

// Largest relative error over the q heads of a dense decode against the float64
// attention over every token.
double dense_worst_err(const TestLayer& t, const std::vector<float>& got) {
  std::vector<uint32_t> all(t.n);
  for (uint32_t i = 0; i < t.n; ++i) all[i] = i;
  double worst = 0;
  for (uint32_t h = 0; h < t.L.n_q_heads; ++h) {
    const auto ref = attend_ref(t, h, all, std::vector<double>(t.n, 0.0));
    worst = std::max(worst, rel_err(got, ref, size_t{h} * t.L.head_dim));
  }
  return worst;
}

TEST_CASE("gpu dense split-K decode matches float64 for f16, bf16, f32 and head dims 64/128/256") {
  SSA_GPU_TEST_OR_SKIP();
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (uint32_t d : {64u, 128u, 256u}) {
      TestLayer t;
      build_layer(t, 8, 2, d, dt, 5003, 256, 16, 16, 77 + d);
      Run r;
      setup_run(r, t, SSA_METHOD_DENSE, 0, 0.4f, 128, 128, 0);
      const std::vector<float> got = run_and_fetch(r, t);
      const double worst = dense_worst_err(t, got);
      INFO(dtype_name(dt), " d=", d, " splits=", r.dec.plan.n_splits, " rel err ", worst);
      CHECK(worst <= tolerance(dt));
    }
  }
}

TEST_CASE("gpu dense decode of a batch of sessions of different lengths in one launch set") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t lens[3] = {17, 4100, 300};
  TestLayer t[3];
  for (int i = 0; i < 3; ++i) build_layer(t[i], 4, 4, 128, DType::kF16, lens[i], 64, 16, 16, 5 + i);
  DecodeBatch b{};
  b.shape = shape_of(t[0].L);
  b.n_items = 3;
  b.proxy = cuda::Proxy::kNone;
  DevBuf<uint8_t> out(3 * 4 * 128 * 2);
  CUDA_OK(cudaMemset(out.p, 0xff, out.n));
  for (int i = 0; i < 3; ++i) {
    b.items[i] = item_of(t[i], out.p + i * 4 * 128 * 2);
    b.items[i].sink_end = b.items[i].local_begin = lens[i];
  }
  Decoder dec;
  CUDA_OK(dec.run(&b));
  const auto got = decode_out(DType::kF16, out.download(out.n), 3 * 4 * 128);
  for (int i = 0; i < 3; ++i) {
    for (uint32_t h = 0; h < 4; ++h) {
      std::vector<uint32_t> all(lens[i]);
      for (uint32_t j = 0; j < lens[i]; ++j) all[j] = j;
      const auto ref = attend_ref(t[i], h, all, std::vector<double>(lens[i], 0.0));
      CHECK(rel_err(got, ref, (size_t{static_cast<uint32_t>(i)} * 4 + h) * 128) <= 1e-3);
    }
  }
}

// GQA groups 1, 8 and 16 (one and two 8-head MMA tiles), 16-token pages (a 64-token
// stage spans 4 pages), split bounds off page boundaries (37 splits) and empty
// trailing splits (250 splits of 13 tokens: 231 used).
TEST_CASE("gpu dense decode for GQA groups 1, 8 and 16 with 16-token pages and empty splits") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t shapes[3][2] = {{2, 2}, {16, 2}, {16, 1}};  // {q heads, KV heads}
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (uint32_t d : {64u, 128u, 256u}) {
      for (const auto& sh : shapes) {
        TestLayer t;
        build_layer(t, sh[0], sh[1], d, dt, 3001, 16, 16, 16, 31 * d + sh[0]);
        for (uint32_t splits : {0u, 37u, 250u}) {
          Run r;
          setup_run(r, t, SSA_METHOD_DENSE, 0, 0.4f, 128, 128, 0);
          r.b.n_splits = splits;
          const std::vector<float> got = run_and_fetch(r, t);
          const double worst = dense_worst_err(t, got);
          INFO(dtype_name(dt), " d=", d, " G=", sh[0] / sh[1], " splits=", r.dec.plan.n_splits, " rel err ",
               worst);
          CHECK(worst <= tolerance(dt));
        }
      }
    }
  }
}

// Host view of one row of the workspace after a sparse run.
struct RowView {
  RowState st;
  std::vector<float> scores;   // n_tokens
  std::vector<uint32_t> heavy, sampled;
};

RowView fetch_row(const Run& r, uint32_t h) {
  const cuda::DecodeItem& it = r.b.items[0];
  RowView v;
  CUDA_OK(cudaMemcpy(&v.st, r.dec.ws.rows + h, sizeof(RowState), cudaMemcpyDeviceToHost));
  v.scores.resize(it.n_tokens);
  CUDA_OK(cudaMemcpy(v.scores.data(), r.dec.ws.scores + it.score_base + size_t{h} * it.n_pad,
                     it.n_tokens * sizeof(float), cudaMemcpyDeviceToHost));
  const size_t sel = it.select_base + size_t{h} * it.select_cap;
  v.heavy.resize(v.st.n_heavy);
  if (v.st.n_heavy)
    CUDA_OK(cudaMemcpy(v.heavy.data(), r.dec.ws.heavy + sel, v.st.n_heavy * 4, cudaMemcpyDeviceToHost));
  v.sampled.resize(v.st.n_unique);
  if (v.st.n_unique)
    CUDA_OK(cudaMemcpy(v.sampled.data(), r.dec.ws.uniq_sorted + sel, v.st.n_unique * 4,
                       cudaMemcpyDeviceToHost));
  return v;
}

TEST_CASE("gpu PQ proxy scores match float64 and mask sink and local tokens") {
  SSA_GPU_TEST_OR_SKIP();
  for (uint32_t G : {1u, 4u, 8u}) {
    TestLayer t;
    build_layer(t, 2 * G, 2, 128, DType::kF16, 9000, 128, 16, 256, 11 + G);
    Run r;
    setup_run(r, t, SSA_METHOD_PQ_TOPK, 400, 0.4f, 100, 60, 0);
    run_and_fetch(r, t);
    for (uint32_t h = 0; h < t.L.n_q_heads; ++h) {
      const RowView v = fetch_row(r, h);
      const auto q = scaled_q(t, h);
      uint32_t bad = 0;
      for (uint32_t i = 0; i < t.n; ++i) {
        const bool cand = i >= r.plan.sink_end && i < r.plan.local_begin;
        if (!cand) {
          bad += v.scores[i] != -INFINITY;
          continue;
        }
        const double ref = pq_logit(t, h, i, q);
        bad += fabs(v.scores[i] - ref) > 1e-4 * (1 + fabs(ref));
      }
      INFO("G=", G, " head ", h);
      CHECK(bad == 0);
    }
  }
}

// The selected set equals the top-k of the scores except among ties (exact ties
// when `slack` is 0; near-ties within slack when scores were rebuilt).
void check_topk(const std::vector<float>& scores, uint32_t begin, uint32_t end,
                const std::vector<uint32_t>& sel, size_t k, float slack = 0.f) {
  REQUIRE(sel.size() == k);
  std::set<uint32_t> s(sel.begin(), sel.end());
  REQUIRE(s.size() == k);
  if (k == 0) return;
  float lowest_in = INFINITY;
  for (uint32_t t : sel) {
    REQUIRE(t >= begin);
    REQUIRE(t < end);
    lowest_in = std::min(lowest_in, scores[t]);
  }
  const float bar = lowest_in + slack * (1.f + fabsf(lowest_in));
  uint32_t above = 0;
  for (uint32_t t = begin; t < end; ++t) {
    if (!s.count(t) && scores[t] > bar) ++above;
  }
  CHECK(above == 0);
  // Same set as the CPU backend's radix top-k on the same scores, up to ties.
  std::vector<uint32_t> cpu;
  topk_indices(scores.data() + begin, end - begin, k, begin, &cpu);
  uint32_t differ = 0;
  for (uint32_t t : cpu) {
    if (!s.count(t) && fabsf(scores[t] - lowest_in) > slack * (1.f + fabsf(lowest_in))) ++differ;
  }
  CHECK(differ == 0);
}

TEST_CASE("gpu radix top-k (PQ_TOPK and ORACLE_TOPK) selects the top k' as the CPU does") {
  SSA_GPU_TEST_OR_SKIP();
  for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK}) {
    // k' of 5% of the tokens, and of 80%: a cut below the histogram's range (the
    // PQ proxy bins only its top half), in the last, uncounted bin.
    for (auto [n, budget] : {std::pair{3000u, 150u}, std::pair{70000u, 3500u}, std::pair{3000u, 2400u}}) {
      TestLayer t;
      build_layer(t, 4, 2, 64, DType::kBF16, n, 256, 8, 64, n + m);
      Run r;
      // 61 sink tokens: the candidates start off 16-byte alignment (the filter's
      // shared-memory path); 64: its direct loads.
      setup_run(r, t, m, budget, 0.4f, n == 3000u ? 61 : 64, 64, 0);
      const auto got = run_and_fetch(r, t);
      for (uint32_t h = 0; h < 4; ++h) {
        const RowView v = fetch_row(r, h);
        INFO("method ", m, " n ", n, " budget ", budget, " head ", h);
        check_topk(v.scores, r.plan.sink_end, r.plan.local_begin, v.heavy, r.plan.kprime);
        CHECK(v.st.n_unique == 0);
        if (m == SSA_METHOD_ORACLE_TOPK) {
          // Exact scores: compare against float64 q.k.
          const auto q = scaled_q(t, h);
          for (uint32_t i = r.plan.sink_end; i < r.plan.local_begin; i += 97) {
            CHECK(fabs(v.scores[i] - exact_logit(t, h, i, q)) < 1e-4 * (1 + fabs(v.scores[i])));
          }
        }
        std::vector<uint32_t> toks;
        for (uint32_t i = 0; i < r.plan.sink_end; ++i) toks.push_back(i);
        for (uint32_t i = r.plan.local_begin; i < n; ++i) toks.push_back(i);
        toks.insert(toks.end(), v.heavy.begin(), v.heavy.end());
        const auto ref = attend_ref(t, h, toks, std::vector<double>(toks.size(), 0.0));
        CHECK(rel_err(got, ref, size_t{h} * 64) <= 8e-3);
      }
    }
  }
}

// One decode of layer t (budget 3500, h = 0.4, 64 sink and 64 local tokens) with
// the decoder knobs that `tweak` sets: the output and every query head's row.
struct Outcome {
  std::vector<float> out;
  std::vector<RowView> rows;
};
Outcome decode_with(const TestLayer& t, ssa_method m, uint64_t step, const std::function<void(Decoder&)>& tweak) {
  Run r;
  setup_run(r, t, m, 3500, 0.4f, 64, 64, step);
  tweak(r.dec);
  Outcome o;
  o.out = run_and_fetch(r, t);
  for (uint32_t h = 0; h < t.L.n_q_heads; ++h) o.rows.push_back(fetch_row(r, h));
  return o;
}

// The sampler takes 32 draws a warp, or 16 where the draws would not fill the GPU
// (sample_group_draws); draw j is Philox draw j of the row's stream either way, so
// both must take the same samples and give the same output, bit for bit.
TEST_CASE("gpu sampler: 32 and 16 draws per warp take the same samples") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 4, 2, 64, DType::kBF16, 70000, 256, 8, 64, 4242);
  for (ssa_method m : {SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    const Outcome a = decode_with(t, m, 3, [](Decoder& d) { d.force_group_draws = 4; });
    const Outcome b = decode_with(t, m, 3, [](Decoder& d) { d.force_group_draws = 2; });
    INFO("method ", m);
    CHECK(a.out == b.out);
    for (uint32_t h = 0; h < 4; ++h) {
      CHECK(a.rows[h].st.n_draws > 0);
      CHECK(a.rows[h].sampled.size() > 100);
      CHECK(a.rows[h].sampled == b.rows[h].sampled);
      CHECK(a.rows[h].heavy == b.rows[h].heavy);
    }
  }
}

// Tokens sharing PQ codes share their scores exactly, so the cut falls inside
// groups of equal scores: the GPU must take the lowest token indices among them,
// the CPU's rule (refine's radix passes and its second select among the ties),
// with boundary lists of about 80 and about 1900 tied candidates; and again with
// lists of 16 entries at most, so that refine finds the boundary bin by scanning
// the row's scores.
TEST_CASE("gpu top-k takes the lowest token indices among equal scores, as the CPU") {
  SSA_GPU_TEST_OR_SKIP();
  for (auto [n, budget] : {std::pair{3000u, 150u}, std::pair{70000u, 3500u}})
  for (uint32_t cap : {0u, 16u}) {
    TestLayer t;
    build_layer(t, 4, 2, 64, DType::kBF16, n, 256, 8, 64, n + 11, 3.0f, 37);
    Run r;
    setup_run(r, t, SSA_METHOD_PQ_TOPK, budget, 0.4f, 64, 64, 0);
    r.dec.force_cut_capacity = cap;
    run_and_fetch(r, t);
    const uint32_t sink = r.plan.sink_end, lb = r.plan.local_begin;
    for (uint32_t h = 0; h < 4; ++h) {
      const RowView v = fetch_row(r, h);
      INFO("n ", n, " head ", h, " list capacity ", r.dec.plan.cut_capacity);
      if (cap) CHECK(v.st.n_cut > cap);  // the scan is what ran
      REQUIRE(v.heavy.size() == r.plan.kprime);
      std::vector<uint32_t> cpu;
      topk_indices(v.scores.data() + sink, lb - sink, r.plan.kprime, sink, &cpu);
      const std::set<uint32_t> got(v.heavy.begin(), v.heavy.end()), want(cpu.begin(), cpu.end());
      CHECK(got == want);
      CHECK(std::is_sorted(v.heavy.begin(), v.heavy.end()));
      // The case is the one meant: some candidate left out ties the lowest score taken.
      float lowest = INFINITY;
      for (uint32_t tok : v.heavy) lowest = std::min(lowest, v.scores[tok]);
      uint32_t tied_out = 0;
      for (uint32_t i = sink; i < lb; ++i) tied_out += !got.count(i) && v.scores[i] == lowest;
      CHECK(tied_out > 0);
    }
  }
}

// A boundary bin longer than its list is found again by scanning the row: the
// same heavy set, the same residual sums (the sampler's draws) and so bitwise
// the same output as with a list that holds it, for every method with a top-k.
TEST_CASE("gpu top-k: a boundary bin past the list's capacity gives the same decode") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 4, 2, 64, DType::kBF16, 70000, 256, 8, 64, 977, 3.0f, 37);
  for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE, SSA_METHOD_HYBRID_UNIFORM}) {
    const Outcome listed = decode_with(t, m, 5, [](Decoder&) {});
    const Outcome scanned_run = decode_with(t, m, 5, [](Decoder& d) { d.force_cut_capacity = 16; });
    INFO("method ", m);
    CHECK(listed.out == scanned_run.out);
    uint32_t scanned = 0;
    for (uint32_t h = 0; h < 4; ++h) {
      scanned += scanned_run.rows[h].st.n_cut > 16;
      CHECK(listed.rows[h].heavy == scanned_run.rows[h].heavy);
      CHECK(listed.rows[h].sampled == scanned_run.rows[h].sampled);
    }
    CHECK(scanned > 0);
  }
}

// Float64 reference of the sampled estimator for the GPU's own read set, plus
// every structural rule of the read set.
void check_sampled_row(const Run& r, const TestLayer& t, uint32_t h, const std::vector<float>& got,
                       double tol) {
  RowView v = fetch_row(r, h);
  const uint32_t sink = r.plan.sink_end, lb = r.plan.local_begin;
  const ssa_method m = r.p.method;
  const float slack = 1e-5f;
  // Heavy set: top |H| of the candidates.
  if (m != SSA_METHOD_SSA_ADAPTIVE) {
    const size_t hk = fixed_heavy_count(m, r.plan.kprime, r.p.heavy_fraction);
    check_topk(v.scores, sink, lb, v.heavy, hk, slack);
  } else {
    // Water-filling on the float64 proposal from the GPU scores.
    float mx = -INFINITY;
    for (uint32_t i = sink; i < lb; ++i) mx = std::max(mx, v.scores[i]);
    double total = 0;
    for (uint32_t i = sink; i < lb; ++i) total += exp(static_cast<double>(v.scores[i]) - mx);
    std::vector<double> qs;
    for (uint32_t i = sink; i < lb; ++i) qs.push_back(exp(static_cast<double>(v.scores[i]) - mx) / total);
    std::sort(qs.rbegin(), qs.rend());
    qs.resize(r.plan.kprime);
    const WaterFill wf = water_fill(qs.data(), qs.size(), 1.0, static_cast<double>(r.plan.kprime));
    CHECK(static_cast<long>(v.st.n_heavy) - static_cast<long>(wf.heavy) <= 1);
    CHECK(static_cast<long>(wf.heavy) - static_cast<long>(v.st.n_heavy) <= 1);
    check_topk(v.scores, sink, lb, v.heavy, v.st.n_heavy, slack);
  }
  CHECK(v.st.n_draws == r.plan.kprime - v.st.n_heavy);
  // Samples: unique, sorted, in the residual, at most m of them.
  std::set<uint32_t> heavy(v.heavy.begin(), v.heavy.end());
  CHECK(v.sampled.size() <= v.st.n_draws);
  CHECK(!v.sampled.empty());
  for (size_t i = 0; i < v.sampled.size(); ++i) {
    CHECK(v.sampled[i] >= sink);
    CHECK(v.sampled[i] < lb);
    CHECK(!heavy.count(v.sampled[i]));
    if (i) CHECK(v.sampled[i] > v.sampled[i - 1]);
  }
  // Estimator in float64: pi from the residual proposal (uniform for HYBRID).
  float mx = -INFINITY;
  for (uint32_t i = sink; i < lb; ++i) mx = std::max(mx, v.scores[i]);
  double wr = 0;
  const bool uniform = m == SSA_METHOD_HYBRID_UNIFORM;
  for (uint32_t i = sink; i < lb; ++i) {
    if (!heavy.count(i)) wr += uniform ? 1.0 : exp(static_cast<double>(v.scores[i]) - mx);
  }
  // The sampler's residual total (fixed point, 2^38 per unit weight), summed by
  // the top-k filter and corrected by refine for the boundary bin.
  CHECK(fabs(v.st.w_total / 274877906944.0 - wr) <= 1e-5 * wr);
  std::vector<uint32_t> toks;
  std::vector<double> lp;
  for (uint32_t i = 0; i < sink; ++i) toks.push_back(i), lp.push_back(0);
  for (uint32_t i = lb; i < t.n; ++i) toks.push_back(i), lp.push_back(0);
  for (uint32_t i : v.heavy) toks.push_back(i), lp.push_back(0);
  for (uint32_t i : v.sampled) {
    const double p = (uniform ? 1.0 : exp(static_cast<double>(v.scores[i]) - mx)) / wr;
    toks.push_back(i);
    lp.push_back(log(inclusion_probability(p, v.st.n_draws, r.p.pi_min)));
  }
  const auto ref = attend_ref(t, h, toks, lp);
  const double e = rel_err(got, ref, size_t{h} * t.L.head_dim);
  INFO("method ", m, " head ", h, " rel err ", e, " |H| ", v.st.n_heavy, " |S| ", v.sampled.size());
  CHECK(e <= tol);
}

TEST_CASE("gpu sampling methods: read-set rules and the estimator match float64") {
  SSA_GPU_TEST_OR_SKIP();
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SAMPLING, SSA_METHOD_HYBRID_UNIFORM,
                       SSA_METHOD_SSA_ADAPTIVE}) {
    for (uint32_t n : {6000u, 40000u}) {
      TestLayer t;
      build_layer(t, 8, 2, 128, DType::kF16, n, 256, 16, 64, n * 7 + m);
      Run r;
      // 127 sink tokens: candidates off 16-byte alignment (the filter's and the
      // draws' unaligned paths).
      setup_run(r, t, m, n / 20, 0.4f, n == 6000u ? 127 : 128, 128, 5);
      const auto got = run_and_fetch(r, t);
      for (uint32_t h = 0; h < t.L.n_q_heads; ++h) check_sampled_row(r, t, h, got, 2e-3);
    }
  }
}

// Sparse rows of every head dim the gather kernel serves, both 2-byte types and
// 16-token pages: the estimator against float64 with automatic splits, one split
// (a long read set through the whole stage ring) and 250 splits (a few tokens each,
// the trailing ones empty).
TEST_CASE("gpu sparse attention: head dims 64/128/256, f16 and bf16, 16-token pages, 1 to 250 splits") {
  SSA_GPU_TEST_OR_SKIP();
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (uint32_t d : {64u, 128u, 256u}) {
      TestLayer t;
      build_layer(t, 4, 2, d, dt, 7000, 16, 16, 64, 77 * d + (dt == DType::kBF16 ? 1 : 0));
      for (uint32_t splits : {0u, 1u, 250u}) {
        Run r;
        setup_run(r, t, SSA_METHOD_SSA, 1500, 0.4f, 64, 64, 3);
        r.b.n_splits = splits;
        const auto got = run_and_fetch(r, t);
        INFO(dtype_name(dt), " d=", d, " splits=", r.dec.plan.n_splits);
        for (uint32_t h = 0; h < t.L.n_q_heads; ++h)
          check_sampled_row(r, t, h, got, std::max(2e-3, tolerance(dt)));
      }
    }
  }
}

// A dense item (read set = every token) between two sparse items of other lengths
// in one sparse launch set with 250 splits: the dense item against float64, each
// sparse item against its own single-item run (same samples: the sampler's stream
// does not depend on the item).
TEST_CASE("gpu sparse attention: a dense item inside a sparse batch of different lengths") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t lens[3] = {5000, 300, 9000};
  constexpr uint32_t kNq = 4, kD = 256;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    TestLayer t[3];
    for (int i = 0; i < 3; ++i) build_layer(t[i], kNq, 2, kD, dt, lens[i], 16, 16, 64, 900 + i);
    const size_t item_bytes = size_t{kNq} * t[0].L.row_bytes();
    Run r;
    setup_run(r, t[0], SSA_METHOD_SSA, 400, 0.4f, 64, 64, 2);
    DevBuf<uint8_t> out(3 * item_bytes);
    CUDA_OK(cudaMemset(out.p, 0xff, out.n));
    r.b.n_items = 3;
    r.b.n_splits = 250;
    for (int i = 0; i < 3; ++i) {
      r.b.items[i] = item_of(t[i], out.p + i * item_bytes);
      cuda::plan_item(plan_decode(lens[i], r.p), r.p, t[i].L.group_size(), &r.b.items[i]);
    }
    r.b.items[1].sink_end = r.b.items[1].local_begin = lens[1];
    r.b.items[1].n_select = r.b.items[1].n_heavy = 0;
    CUDA_OK(r.dec.run(&r.b));
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = decode_out(dt, out.download(out.n), 3 * kNq * kD);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> single;
      if (i != 1) {
        Run s;
        setup_run(s, t[i], SSA_METHOD_SSA, 400, 0.4f, 64, 64, 2);
        single = run_and_fetch(s, t[i]);
      }
      for (uint32_t h = 0; h < kNq; ++h) {
        std::vector<double> ref;
        if (i == 1) {
          std::vector<uint32_t> all(lens[1]);
          for (uint32_t j = 0; j < lens[1]; ++j) all[j] = j;
          ref = attend_ref(t[1], h, all, std::vector<double>(lens[1], 0.0));
        } else {
          ref.assign(single.begin() + h * kD, single.begin() + (h + 1) * kD);
        }
        INFO(dtype_name(dt), " item ", i, " head ", h);
        CHECK(rel_err(got, ref, (size_t{static_cast<uint32_t>(i)} * kNq + h) * kD) <= tolerance(dt));
      }
    }
  }
}

TEST_CASE("gpu empirical inclusion frequencies match pi") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 2, 1, 64, DType::kF32, 3000, 64, 8, 32, 99, 1.0f);
  // 64 sink tokens: the draws read scores with 16-byte loads; 61: one by one.
  for (uint32_t sink : {64u, 61u}) {
    INFO("sink ", sink);
    Run r;
    setup_run(r, t, SSA_METHOD_SSA, 300, 0.4f, sink, 64, 0);
    const uint32_t T = 3000;
    std::vector<std::map<uint32_t, uint32_t>> hits(2);
    RowView first[2];
    for (uint32_t step = 0; step < T; ++step) {
      r.b.step = step;
      CUDA_OK(r.dec.run(&r.b));
      for (uint32_t h = 0; h < 2; ++h) {
        RowView v = fetch_row(r, h);
        for (uint32_t i : v.sampled) ++hits[h][i];
        if (step == 0) first[h] = std::move(v);
      }
    }
    for (uint32_t h = 0; h < 2; ++h) {
      const RowView& v = first[h];
      std::set<uint32_t> heavy(v.heavy.begin(), v.heavy.end());
      // pi from the float64 PQ proxy of the reference (independent of the GPU scores).
      const auto q = scaled_q(t, h);
      double mx = -INFINITY;
      std::vector<double> s(t.n, -INFINITY);
      for (uint32_t i = r.plan.sink_end; i < r.plan.local_begin; ++i) {
        s[i] = pq_logit(t, h, i, q);
        mx = std::max(mx, s[i]);
      }
      double wr = 0;
      for (uint32_t i = r.plan.sink_end; i < r.plan.local_begin; ++i)
        if (!heavy.count(i)) wr += exp(s[i] - mx);
      uint32_t bad = 0, checked = 0;
      double sum_pi = 0, sum_f = 0;
      for (uint32_t i = r.plan.sink_end; i < r.plan.local_begin; ++i) {
        if (heavy.count(i)) {
          CHECK(hits[h].count(i) == 0);
          continue;
        }
        const double p = exp(s[i] - mx) / wr;
        const double pi = -expm1(static_cast<double>(v.st.n_draws) * log1p(-p));
        const double f = static_cast<double>(hits[h].count(i) ? hits[h][i] : 0) / T;
        sum_pi += pi;
        sum_f += f;
        const double sigma = sqrt(pi * (1 - pi) / T);
        if (pi > 1e-3) {
          ++checked;
          if (fabs(f - pi) > 5.5 * sigma + 1e-4) ++bad;
        }
      }
      INFO("head ", h, " checked ", checked, " sum pi ", sum_pi, " sum freq ", sum_f);
      CHECK(checked > 50);
      CHECK(bad == 0);
      CHECK(fabs(sum_f - sum_pi) < 0.01 * sum_pi);
    }
  }
}

TEST_CASE("gpu decode is deterministic and replays correctly from a captured CUDA graph") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 8, 2, 128, DType::kF16, 20000, 256, 16, 256, 4242);
  const size_t bytes = 8 * 128 * 2;
  auto direct = [&](uint64_t step) {
    Run r;
    setup_run(r, t, SSA_METHOD_SSA, 800, 0.4f, 128, 128, step);
    CUDA_OK(r.dec.run(&r.b));
    CUDA_OK(cudaDeviceSynchronize());
    return r.out.download(bytes);
  };
  const auto a7 = direct(7), b7 = direct(7), a8 = direct(8);
  CHECK(a7 == b7);
  CHECK(a7 != a8);

  Run g;
  setup_run(g, t, SSA_METHOD_SSA, 800, 0.4f, 128, 128, 0);
  DevBuf<uint64_t> step_dev(1);
  g.b.step_dev = step_dev.p;
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_OK(g.dec.run(&g.b, st));  // plans the workspace and sets kernel attributes
  CUDA_OK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  const cudaError_t launched = cuda::run_decode(g.b, g.dec.plan, g.dec.ws, st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(launched);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t step : {7ull, 8ull, 7ull}) {
    CUDA_OK(cudaMemcpyAsync(step_dev.p, &step, 8, cudaMemcpyHostToDevice, st));
    CUDA_OK(cudaMemsetAsync(g.out.p, 0xff, bytes, st));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    CHECK(g.out.download(bytes) == (step == 7 ? a7 : a8));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace ssa::gputest

namespace ssa::gputest {
namespace {

// Small enough for compute-sanitizer (memcheck, racecheck): every stage once.
TEST_CASE("gpu small end-to-end case for the sanitizers") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 4, 2, 64, DType::kF16, 2600, 64, 8, 32, 31);
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_SSA,
                       SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SSA_ADAPTIVE}) {
    Run r;
    setup_run(r, t, m, 400, 0.4f, 32, 32, 1);
    const auto got = run_and_fetch(r, t);
    for (float x : got) REQUIRE(std::isfinite(x));
  }
}

}  // namespace
}  // namespace ssa::gputest
