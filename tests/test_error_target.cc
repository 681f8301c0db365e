// Error-targeted decode (target_error > 0): achieved error against a float64
// dense reference, statistically, on structured and random contexts; budgets
// that grow as epsilon shrinks; the cap; bitwise reproducibility; the estimator
// over the rows read; and the rejection of bad parameters.
#include <doctest/doctest.h>

#include <math.h>
#include <string.h>

#include <random>
#include <string>
#include <vector>

#include "decode/decode.h"
#include "decode/decode_plan.h"
#include "select/error_bound.h"
#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

// A session over one layer of K/V (float32, so the reference sees exactly the
// stored values) and the float64 dense output of every query head.
struct Workload {
  uint32_t d = 0, nq = 0, nkv = 0;
  size_t n = 0;
  std::vector<float> q;
  std::vector<std::vector<double>> ref;  // [nq][d]
  SessionPtr session;
};

Workload make_workload(ssa_runtime* rt, const std::vector<float>& K, const std::vector<float>& V,
                       std::vector<float> q, size_t n, uint32_t nkv, uint32_t nq, uint32_t d) {
  Workload w;
  w.d = d;
  w.nq = nq;
  w.nkv = nkv;
  w.n = n;
  w.q = std::move(q);
  w.session = make_session(rt, make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(w.session.get(), 0, K, V, n, SSA_DTYPE_F32);
  const std::vector<double> Kd(K.begin(), K.end()), Vd(V.begin(), V.end()), qd(w.q.begin(), w.q.end());
  for (uint32_t h = 0; h < nq; ++h) {
    const auto Kh = head_rows(Kd, n, nkv, d, h / (nq / nkv));
    const auto Vh = head_rows(Vd, n, nkv, d, h / (nq / nkv));
    w.ref.push_back(dense_attention_f64(&qd[size_t{h} * d], Kh.data(), Vh.data(), n, d));
  }
  return w;
}

Workload structured_workload(ssa_runtime* rt, size_t n, uint64_t seed) {
  StructuredOptions o;
  o.seed = seed;
  const auto c = make_structured_context(n, 2, 8, 64, o);
  return make_workload(rt, c.K, c.V, c.q, n, 2, 8, 64);
}

// Gaussian keys and values; queries of norm ~2.5 sqrt(d) give attention that is
// neither flat nor a few spikes, and a PQ proxy that is only roughly right.
Workload random_workload(ssa_runtime* rt, size_t n, uint64_t seed) {
  const uint32_t d = 64, nkv = 2, nq = 8;
  return make_workload(rt, random_vec(n * nkv * d, seed), random_vec(n * nkv * d, seed + 1),
                       random_vec(size_t{nq} * d, seed + 2, 2.5f), n, nkv, nq, d);
}

ssa_decode_params target_params(ssa_method m, float eps, float delta = 0.1f) {
  ssa_decode_params p = params(m);
  p.n_sink = 16;
  p.n_local = 64;
  p.target_error = eps;
  p.target_delta = delta;
  return p;
}

struct Achieved {
  size_t trials = 0, within = 0;
  double mean_err = 0.0, mean_budget = 0.0, mean_read = 0.0;
  uint64_t capped = 0;
};

// Decodes every head at steps 0..steps-1 and compares each with the reference.
void measure(const Workload& w, const ssa_decode_params& base, int steps, Achieved* a) {
  for (int step = 0; step < steps; ++step) {
    ssa_decode_params p = base;
    p.step = static_cast<uint64_t>(step);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    const auto out = run_decode(w.session.get(), 0, w.q, SSA_DTYPE_F32, p, &st);
    for (uint32_t h = 0; h < w.nq; ++h) {
      const std::vector<double> got(out.begin() + size_t{h} * w.d, out.begin() + size_t{h + 1} * w.d);
      const double e = rel_l2(got.data(), w.ref[h].data(), w.d);
      a->trials += 1;
      a->within += e <= base.target_error ? 1 : 0;
      a->mean_err += e;
    }
    a->mean_budget += static_cast<double>(st.target_budget);
    a->mean_read += static_cast<double>(st.tokens_read);
    a->capped += st.capped_heads;
  }
}

void finish(Achieved* a) {
  a->mean_err /= static_cast<double>(a->trials);
  a->mean_budget /= static_cast<double>(a->trials);
  a->mean_read /= static_cast<double>(a->trials);
}

// The least acceptable coverage over `trials` decodes when the true coverage
// is 1 - delta: three binomial standard deviations below it.
double coverage_floor(double delta, size_t trials) {
  return 1.0 - delta - 3.0 * sqrt(delta * (1.0 - delta) / static_cast<double>(trials));
}

}  // namespace

TEST_CASE("error target: achieved error <= epsilon in >= 1 - delta of decodes (structured, random)") {
  auto rt = make_runtime(2);
  const size_t n = 16384;
  std::vector<Workload> structured, random;
  for (uint64_t seed : {7u, 8u}) structured.push_back(structured_workload(rt.get(), n, seed));
  for (uint64_t seed : {100u, 200u}) random.push_back(random_workload(rt.get(), n, seed));
  struct Cell {
    float eps, delta;
  };
  // A cap of N lets a head that cannot reach epsilon sparsely read everything,
  // so no decode is excused by the cap.
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    for (const Cell cell : {Cell{0.05f, 0.1f}, Cell{0.1f, 0.1f}, Cell{0.2f, 0.1f}, Cell{0.1f, 0.3f}}) {
      for (int kind = 0; kind < 2; ++kind) {
        CAPTURE(m);
        CAPTURE(cell.eps);
        CAPTURE(cell.delta);
        CAPTURE(kind);
        ssa_decode_params p = target_params(m, cell.eps, cell.delta);
        p.max_budget = static_cast<uint32_t>(n);
        Achieved a;
        for (const Workload& w : kind == 0 ? structured : random) measure(w, p, 6, &a);
        finish(&a);
        const double coverage = static_cast<double>(a.within) / static_cast<double>(a.trials);
        MESSAGE(std::string(kind == 0 ? "structured" : "random") << " method " << m << " eps " << cell.eps
                << " delta " << cell.delta << ": coverage " << coverage << " over " << a.trials
                << " decodes, mean error " << a.mean_err << ", budget " << a.mean_budget << ", read "
                << a.mean_read << " of " << n);
        CHECK(a.capped == 0);
        CHECK(coverage >= coverage_floor(cell.delta, a.trials));
        CHECK(a.mean_read < 0.5 * static_cast<double>(n));
      }
    }
  }
}

TEST_CASE("error target: the budget grows as epsilon shrinks; both read far less than N") {
  auto rt = make_runtime(2);
  const size_t n = 16384;
  const Workload w = structured_workload(rt.get(), n, 9);
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    CAPTURE(m);
    double prev_budget = 0.0, prev_read = 0.0, prev_err = 1.0;
    for (float eps : {0.4f, 0.2f, 0.1f, 0.05f}) {
      CAPTURE(eps);
      Achieved a;
      measure(w, target_params(m, eps), 4, &a);
      finish(&a);
      CHECK(a.mean_budget > 1.3 * prev_budget);
      CHECK(a.mean_read > 1.3 * prev_read);
      CHECK(a.mean_err < prev_err);
      CHECK(a.mean_read < 0.25 * static_cast<double>(n));
      prev_budget = a.mean_budget;
      prev_read = a.mean_read;
      prev_err = a.mean_err;
    }
  }
}

TEST_CASE("error target: the output is the HT estimator over the rows read; stats add up") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 12000;
  const auto ctx = make_structured_context(n, nkv, nq, d);
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const std::vector<double> Kd(ctx.K.begin(), ctx.K.end()), Vd(ctx.V.begin(), ctx.V.end());
  const std::vector<double> qd(ctx.q.begin(), ctx.q.end());
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    for (uint32_t floor : {0u, 400u}) {
      CAPTURE(m);
      CAPTURE(floor);
      ssa_decode_params p = target_params(m, 0.1f);
      p.budget = floor;
      p.max_budget = static_cast<uint32_t>(n / 2);
      p.step = 3;
      std::vector<ssa::HeadTrace> traces;
      std::vector<float> out(size_t{nq} * d);
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      REQUIRE(ssa::decode(*s, 0, ctx.q.data(), out.data(), p, &st, &traces).ok());
      uint64_t read = 0;
      const uint64_t fixed = 16 + 64;
      for (uint32_t h = 0; h < nq; ++h) {
        const auto& tr = traces[h];
        read += tr.tokens.size();
        std::vector<double> log_pi(tr.log_pi.begin(), tr.log_pi.end());
        const auto Kh = head_rows(Kd, n, nkv, d, h / 4), Vh = head_rows(Vd, n, nkv, d, h / 4);
        const auto ref = ht_attention_f64(&qd[size_t{h} * d], Kh.data(), Vh.data(), d, tr.tokens, log_pi);
        const std::vector<double> got(out.begin() + size_t{h} * d, out.begin() + size_t{h + 1} * d);
        CHECK(rel_l2(got.data(), ref.data(), d) < 2e-5);
      }
      CHECK(st.tokens_read == read);
      CHECK(st.tokens_read == nq * fixed + st.heavy_tokens + st.unique_samples);
      CHECK(st.target_budget == nq * fixed + st.heavy_tokens + st.draws);
      CHECK(st.target_budget >= uint64_t{nq} * floor);  // the floor (duplicates make reads fewer)
      CHECK(st.unique_samples <= st.draws);
      CHECK(st.draws > 0);
      CHECK(st.capped_heads == 0);
      CHECK(st.predicted_error > 0.0);
      CHECK(st.predicted_error <= nq * 0.1 * (1 + 1e-9));
      CHECK(st.scored_tokens == nq * (n - fixed));
    }
  }
}

TEST_CASE("error target: max_budget caps every head and capped heads are reported") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 16384;
  const Workload w = structured_workload(rt.get(), n, 11);
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    CAPTURE(m);
    // A target no head can meet within 600 rows.
    ssa_decode_params p = target_params(m, 0.005f);
    p.max_budget = 600;
    std::vector<ssa::HeadTrace> traces;
    std::vector<float> out(size_t{nq} * d);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    REQUIRE(ssa::decode(*w.session, 0, w.q.data(), out.data(), p, &st, &traces).ok());
    for (const auto& tr : traces) CHECK(tr.tokens.size() <= 600);
    CHECK(st.capped_heads == nq);
    CHECK(st.target_budget <= uint64_t{nq} * 600);
    CHECK(st.target_budget >= uint64_t{nq} * 550);  // it spends (nearly) all it may
    CHECK(st.predicted_error > nq * 0.005);
    // The default cap is N / 5.
    p.target_error = 0.001f;
    p.max_budget = 0;
    REQUIRE(ssa::decode(*w.session, 0, w.q.data(), out.data(), p, &st, &traces).ok());
    for (const auto& tr : traces) CHECK(tr.tokens.size() <= (n + 4) / 5);
    CHECK(st.capped_heads == nq);
    // A cap below sink + local leaves only those rows: capped, error unknown.
    p.max_budget = 50;
    REQUIRE(ssa::decode(*w.session, 0, w.q.data(), out.data(), p, &st, &traces).ok());
    CHECK(st.tokens_read == uint64_t{nq} * 80);
    CHECK(st.capped_heads == nq);
    CHECK(isinf(st.predicted_error));
    // A reachable target under a generous cap: nothing capped.
    p = target_params(m, 0.3f);
    p.max_budget = static_cast<uint32_t>(n / 2);
    REQUIRE(ssa::decode(*w.session, 0, w.q.data(), out.data(), p, &st, &traces).ok());
    CHECK(st.capped_heads == 0);
  }
}

TEST_CASE("error target: a cap covering the context lets a tight target read everything (exact)") {
  auto rt = make_runtime(2);
  const size_t n = 3000;
  const Workload w = random_workload(rt.get(), n, 5);
  ssa_decode_params p = target_params(SSA_METHOD_SSA, 1e-4f);
  p.max_budget = static_cast<uint32_t>(n);
  ssa_decode_stats st;
  ssa_decode_stats_init(&st);
  const auto out = run_decode(w.session.get(), 0, w.q, SSA_DTYPE_F32, p, &st);
  CHECK(st.tokens_read == uint64_t{w.nq} * n);
  CHECK(st.capped_heads == 0);
  CHECK(st.predicted_error == 0.0);
  for (uint32_t h = 0; h < w.nq; ++h) {
    const std::vector<double> got(out.begin() + size_t{h} * w.d, out.begin() + size_t{h + 1} * w.d);
    CHECK(rel_l2(got.data(), w.ref[h].data(), w.d) < 1e-5);
  }
}

TEST_CASE("error target: bitwise reproducible for a seed and step, whatever the thread count") {
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 12000;
  const auto ctx = make_structured_context(n, nkv, nq, d);
  std::vector<std::vector<float>> outs;
  std::vector<ssa_decode_stats> stats;
  for (int threads : {1, 2, 3}) {
    auto rt = make_runtime(threads, 77);
    auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F16));
    append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      ssa_decode_params p = target_params(m, 0.08f);
      p.step = 5;
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      outs.push_back(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p, &st));
      stats.push_back(st);
      if (threads == 1) {
        p.step = 6;
        CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p) != outs.back());
        p.step = 5;
        p.seed = 77;  // explicit seed equal to the runtime's default
        CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p) == outs.back());
      }
    }
  }
  for (size_t i = 2; i < outs.size(); ++i) {
    CHECK(outs[i] == outs[i % 2]);
    CHECK(memcmp(&stats[i], &stats[i % 2], sizeof(ssa_decode_stats)) == 0);
  }
}

TEST_CASE("error target: bad parameters are rejected with a message and write nothing") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 3000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 1), random_vec(n * nkv * d, 2), n, SSA_DTYPE_F32);
  const auto q = random_vec(size_t{nq} * d, 3, 2.0f);
  auto expect_rejected = [&](const ssa_decode_params& p, const char* needle) {
    std::vector<float> out(q.size(), 123.0f);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    st.tokens_read = 99;
    CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, &st) == SSA_ERR_INVALID_ARGUMENT);
    const std::string msg = ssa_last_error_message();
    CAPTURE(msg);
    CHECK(msg.find(needle) != std::string::npos);
    for (float x : out) CHECK(x == 123.0f);
    CHECK(st.tokens_read == 99);
    ssa_decode_item item{s.get(), q.data(), out.data()};
    CHECK(ssa_decode_batch(&item, 1, 0, &p) == SSA_ERR_INVALID_ARGUMENT);
    for (float x : out) CHECK(x == 123.0f);
  };
  for (float eps : {-0.1f, -0.0f - 1e-30f, NAN, INFINITY, -INFINITY}) {
    CAPTURE(eps);
    ssa_decode_params p = target_params(SSA_METHOD_SSA, eps);
    expect_rejected(p, "target_error");
  }
  for (float delta : {0.0f, 1.0f, -0.5f, 1.5f, NAN, INFINITY}) {
    CAPTURE(delta);
    expect_rejected(target_params(SSA_METHOD_SSA_ADAPTIVE, 0.1f, delta), "target_delta");
  }
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                       SSA_METHOD_SAMPLING}) {
    CAPTURE(m);
    expect_rejected(target_params(m, 0.1f), "SSA or SSA_ADAPTIVE");
  }
  ssa_decode_params p = target_params(SSA_METHOD_SSA, 0.1f);
  p.heavy_fraction = 1.0f;
  expect_rejected(p, "heavy_fraction");
  p = target_params(SSA_METHOD_SSA, 0.1f);
  p.budget = 500;
  p.max_budget = 400;
  expect_rejected(p, "max_budget");
  // target_delta is not read while the target is off.
  p = params(SSA_METHOD_SSA);
  p.target_delta = 7.0f;
  std::vector<float> out(q.size());
  CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, nullptr) == SSA_OK);
}

TEST_CASE("error target: sparsity is not read (NaN, 0.5, infinite sparsity decode as the default)") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 3000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 4), random_vec(n * nkv * d, 5), n, SSA_DTYPE_F32);
  const auto q = random_vec(size_t{nq} * d, 6, 2.0f);
  for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    CAPTURE(m);
    ssa_decode_params p = target_params(m, 0.1f);
    p.step = 3;
    ssa_decode_stats want_stats;
    ssa_decode_stats_init(&want_stats);
    const std::vector<float> want = run_decode(s.get(), 0, q, SSA_DTYPE_F32, p, &want_stats);
    for (float sparsity : {NAN, 0.5f, 0.0f, -3.0f, INFINITY}) {
      CAPTURE(sparsity);
      p.sparsity = sparsity;
      std::vector<float> out(q.size());
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const ssa_status status = ssa_decode(s.get(), 0, q.data(), out.data(), &p, &st);
      CAPTURE(ssa_last_error_message());
      REQUIRE(status == SSA_OK);
      CHECK(out == want);
      CHECK(memcmp(&st, &want_stats, sizeof st) == 0);
    }
    // Off again: sparsity is read and checked.
    p.target_error = 0.0f;
    p.sparsity = 0.5f;
    std::vector<float> out(q.size());
    CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("decode params and stats from an older header (without the error-target fields) work") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 3000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 1), random_vec(n * nkv * d, 2), n, SSA_DTYPE_F32);
  const auto q = random_vec(size_t{nq} * d, 3, 2.0f);
  ssa_decode_params full = params(SSA_METHOD_SSA, 0, 10.0f);
  full.step = 2;
  std::vector<float> expect(q.size()), got(q.size());
  REQUIRE(ssa_decode(s.get(), 0, q.data(), expect.data(), &full, nullptr) == SSA_OK);
  // An old caller's struct ends where target_error starts; whatever lies beyond
  // (here: values that would be rejected) is not read.
  ssa_decode_params old = full;
  old.struct_size = static_cast<uint32_t>(ssa::kDecodeParamsMinSize);
  old.target_error = -1.0f;
  old.target_delta = NAN;
  ssa_decode_stats st;
  ssa_decode_stats_init(&st);
  st.struct_size = static_cast<uint32_t>(ssa::kDecodeStatsMinSize);
  st.target_budget = 777;
  st.capped_heads = 55;
  REQUIRE(ssa_decode(s.get(), 0, q.data(), got.data(), &old, &st) == SSA_OK);
  CHECK(got == expect);
  CHECK(st.tokens_read > 0);
  CHECK(st.struct_size == ssa::kDecodeStatsMinSize);
  CHECK(st.target_budget == 777);  // beyond the caller's struct: not written
  CHECK(st.capped_heads == 55);
  ssa_decode_item item{s.get(), q.data(), got.data()};
  REQUIRE(ssa_decode_batch(&item, 1, 0, &old) == SSA_OK);
  CHECK(got == expect);
  // Smaller than the oldest layout: rejected.
  old.struct_size = static_cast<uint32_t>(ssa::kDecodeParamsMinSize - 8);
  CHECK(ssa_decode(s.get(), 0, q.data(), got.data(), &old, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  st.struct_size = static_cast<uint32_t>(ssa::kDecodeStatsMinSize - 8);
  CHECK(ssa_decode(s.get(), 0, q.data(), got.data(), &full, &st) == SSA_ERR_INVALID_ARGUMENT);
}


TEST_CASE("confidence factor: normal quantile squared, and it bounds Gaussian errors of any shape") {
  CHECK(ssa::confidence_factor(0.1) == doctest::Approx(1.6448536 * 1.6448536).epsilon(1e-6));
  CHECK(ssa::confidence_factor(0.05) == doctest::Approx(1.959964 * 1.959964).epsilon(1e-6));
  CHECK(ssa::confidence_factor(0.01) == doctest::Approx(2.5758293 * 2.5758293).epsilon(1e-6));
  CHECK(ssa::confidence_factor(0.5) == ssa::kMinConfidenceFactor);  // z^2 = 0.45 would not bound rank 2
  // Monte Carlo: P(||e||^2 > c E||e||^2) <= delta for e ~ N(0, diag(lambda)).
  std::mt19937_64 rng(5);
  std::normal_distribution<double> g(0.0, 1.0);
  const std::vector<std::vector<double>> shapes = {
      {1.0}, {1.0, 1.0}, {0.9, 0.1}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, {0.5, 0.2, 0.1, 0.1, 0.05, 0.05}};
  for (double delta : {0.05, 0.1, 0.2, 0.3, 0.5}) {
    const double c = ssa::confidence_factor(delta);
    for (const auto& lambda : shapes) {
      double tr = 0.0;
      for (double l : lambda) tr += l;
      const int trials = 200000;
      int over = 0;
      for (int i = 0; i < trials; ++i) {
        double e2 = 0.0;
        for (double l : lambda) {
          const double z = g(rng);
          e2 += l * z * z;
        }
        over += e2 > c * tr;
      }
      CAPTURE(delta);
      CAPTURE(lambda.size());
      CHECK(over / static_cast<double>(trials) <= delta + 0.003);
    }
  }
}
