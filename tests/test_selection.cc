// Selection stages against independent references: radix top-k vs a full sort,
// the three-level sampler's inclusion frequencies vs pi, and Monte Carlo
// unbiasedness of the Horvitz-Thompson numerator and denominator.
#include <doctest/doctest.h>

#include <math.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "common/inclusion_probability.h"
#include "select/radix_topk.h"
#include "select/residual_sampler.h"
#include "select/selection.h"

TEST_CASE("radix top-k selects exactly the k largest (ties to lower index)") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const size_t n = 1 + rng() % 5000;
    std::vector<float> x(n);
    std::normal_distribution<float> g(0.0f, 3.0f);
    for (auto& v : x) v = trial % 3 == 0 ? std::round(g(rng)) : g(rng);  // some with many ties
    const size_t k = rng() % (n + 2);
    std::vector<uint32_t> got;
    ssa::topk_indices(x.data(), n, k, 100, &got);
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return x[a] > x[b]; });
    std::vector<uint32_t> want(order.begin(), order.begin() + std::min(k, n));
    for (auto& w : want) w += 100;
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    REQUIRE(got == want);
  }
}

TEST_CASE("three-level sampler: inclusion frequencies match pi = 1-(1-p)^m") {
  const size_t n = 3000;  // spans several 1024-token chunks, a partial last one
  std::mt19937 rng(5);
  std::exponential_distribution<float> ex(1.0f);
  std::vector<float> w(n);
  for (auto& v : w) v = ex(rng) * ex(rng);
  for (size_t i = 0; i < n; i += 7) w[i] = 0.0f;  // excluded tokens (e.g. heavy)
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const uint64_t m = 300;
  const int trials = 4000;
  std::vector<int> hits(n, 0);
  ssa::SelectScratch scratch;
  ssa::Selection sel;
  ssa::compute_block_sums(w.data(), n, scratch);
  for (int t = 0; t < trials; ++t) {
    sel.clear();
    ssa::sample_residual(w.data(), n, 0, m, 1e-12f, ssa::make_rng_stream(99, t, 3, 1), scratch, &sel);
    CHECK(sel.draws == m);
    for (size_t r = 0; r < sel.tokens.size(); ++r) {
      const uint32_t i = sel.tokens[r];
      ++hits[i];
      // The library's pi equals the formula on the true p_i.
      const double want = 1.0 - pow(1.0 - w[i] / total, static_cast<double>(m));
      REQUIRE(exp(static_cast<double>(sel.log_pi[r])) == doctest::Approx(want).epsilon(2e-5));
    }
  }
  double chi2 = 0.0;
  size_t df = 0;
  for (size_t i = 0; i < n; ++i) {
    const double pi = 1.0 - pow(1.0 - w[i] / total, static_cast<double>(m));
    if (w[i] == 0.0f) {
      CHECK(hits[i] == 0);  // zero weight is never drawn
      continue;
    }
    const double var = pi * (1.0 - pi) / trials;
    if (var <= 0.0) continue;
    const double f = static_cast<double>(hits[i]) / trials;
    chi2 += (f - pi) * (f - pi) / var;
    ++df;
  }
  // chi2 ~ df +- sqrt(2 df); allow 6 standard deviations.
  MESSAGE("inclusion chi2 = " << chi2 << " over " << df << " tokens");
  CHECK(fabs(chi2 - df) < 6.0 * sqrt(2.0 * df));
}

TEST_CASE("SSA selection: HT numerator and denominator are unbiased (Monte Carlo)") {
  const size_t n = 2000;
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> proxy(n);
  std::vector<double> w(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    proxy[i] = 1.5f * g(rng);
    // True logits differ from the proxy (an imperfect proxy).
    w[i] = exp(static_cast<double>(proxy[i]) + 0.5 * g(rng));
    v[i] = g(rng);
  }
  const double true_den = std::accumulate(w.begin(), w.end(), 0.0);
  double true_num = 0.0;
  for (size_t i = 0; i < n; ++i) true_num += w[i] * v[i];

  for (ssa_method method : {SSA_METHOD_SSA, SSA_METHOD_SAMPLING, SSA_METHOD_HYBRID_UNIFORM,
                            SSA_METHOD_SSA_ADAPTIVE}) {
    ssa::SelectParams sp{method, 60, 0.4f, 1e-12f};
    ssa::SelectScratch scratch;
    ssa::Selection sel;
    const int trials = 6000;
    double sd = 0, sd2 = 0, sn = 0, sn2 = 0;
    for (int t = 0; t < trials; ++t) {
      ssa::select_tokens(sp, proxy.data(), n, 0, ssa::make_rng_stream(7, t, 0, 0), scratch, &sel);
      double den = 0.0, num = 0.0;
      for (size_t r = 0; r < sel.tokens.size(); ++r) {
        const double hw = w[sel.tokens[r]] / exp(static_cast<double>(sel.log_pi[r]));
        den += hw;
        num += hw * v[sel.tokens[r]];
      }
      sd += den;
      sd2 += den * den;
      sn += num;
      sn2 += num * num;
    }
    const double mden = sd / trials, mnum = sn / trials;
    const double se_den = sqrt((sd2 / trials - mden * mden) / trials);
    const double se_num = sqrt((sn2 / trials - mnum * mnum) / trials);
    MESSAGE("method " << method << ": E[den] = " << mden << " vs " << true_den << " (se " << se_den
                      << "), E[num] = " << mnum << " vs " << true_num << " (se " << se_num << ")");
    // log_pi is stored as float: relative rounding 1e-7 per weight, far below the SE.
    CHECK(fabs(mden - true_den) < 5.0 * se_den);
    CHECK(fabs(mnum - true_num) < 5.0 * se_num);
    CHECK(se_den < 0.05 * true_den);  // the test has power: the SE is small
  }
}

TEST_CASE("fixed heavy count: round(h k'), top-k methods take all, sampling none") {
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_SSA, 100, 0.4f) == 40);
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_SSA, 7, 0.5f) == 4);  // 3.5: half to even
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_HYBRID_UNIFORM, 100, 1.0f) == 100);
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_SAMPLING, 100, 0.4f) == 0);
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_PQ_TOPK, 100, 0.0f) == 100);
  CHECK(ssa::fixed_heavy_count(SSA_METHOD_ORACLE_TOPK, 100, 0.0f) == 100);
}
