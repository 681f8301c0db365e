// The worked example of docs/ALGORITHM.md (#worked-example), number for number: proxy q = (.5,.2,.1,.1,.1),
// true weights w = (5,2,1,1,1), k = 3, no sink/local.
#include <doctest/doctest.h>

#include <math.h>

#include <vector>

#include "common/inclusion_probability.h"
#include "common/water_filling.h"
#include "select/residual_sampler.h"
#include "select/selection.h"

namespace {

const std::vector<double> kProxy = {0.5, 0.2, 0.1, 0.1, 0.1};
const std::vector<double> kTrueW = {5, 2, 1, 1, 1};

}  // namespace

TEST_CASE("worked example: water-filling gives lambda = 4 and H = {token 1}") {
  const ssa::WaterFill wf = ssa::water_fill(kProxy.data(), kProxy.size(), 1.0, 3.0);
  CHECK(wf.heavy == 1);
  CHECK(wf.lambda == doctest::Approx(4.0).epsilon(1e-12));
  // The defining equation: sum min(1, lambda q_i) = k'.
  double s = 0.0;
  for (double q : kProxy) s += std::min(1.0, wf.lambda * q);
  CHECK(s == doctest::Approx(3.0).epsilon(1e-12));
}

TEST_CASE("worked example: top-k keeps tokens 1..3, denominator 8") {
  CHECK(kTrueW[0] + kTrueW[1] + kTrueW[2] == 8.0);
}

TEST_CASE("worked example: m = 2 draws, pi_2 = 0.64, pi_4 = 0.36, denominator ~ 10.9") {
  const double m = 3 - 1;  // k' - |H|
  CHECK(m == 2);
  // Residual proposal renormalised without the heavy token.
  const double rest = 0.5;
  const double p2 = kProxy[1] / rest, p4 = kProxy[3] / rest;
  CHECK(p2 == doctest::Approx(0.4));
  CHECK(p4 == doctest::Approx(0.2));
  const double pi2 = ssa::inclusion_probability(p2, m, 1e-4);
  const double pi4 = ssa::inclusion_probability(p4, m, 1e-4);
  CHECK(pi2 == doctest::Approx(0.64).epsilon(1e-12));
  CHECK(pi4 == doctest::Approx(0.36).epsilon(1e-12));
  const double den = kTrueW[0] + kTrueW[1] / pi2 + kTrueW[3] / pi4;
  CHECK(den == doctest::Approx(10.902777).epsilon(1e-6));
}

TEST_CASE("worked example: the weighted denominator is unbiased (= 10) over all draw pairs") {
  // Exact expectation by enumerating both draws of the residual sampler's law.
  const std::vector<double> p = {0.4, 0.2, 0.2, 0.2};
  const std::vector<double> w = {2, 1, 1, 1};
  double expect = 0.0;
  for (size_t a = 0; a < 4; ++a) {
    for (size_t b = 0; b < 4; ++b) {
      double den = 5.0;  // the heavy token, pi = 1
      for (size_t i = 0; i < 4; ++i) {
        if (i == a || i == b) den += w[i] / ssa::inclusion_probability(p[i], 2, 1e-9);
      }
      expect += p[a] * p[b] * den;
    }
  }
  CHECK(expect == doctest::Approx(10.0).epsilon(1e-12));
}

TEST_CASE("worked example through the library's SSA_ADAPTIVE selection") {
  // Proxy logits log(q) give softmax(q) = q exactly.
  std::vector<float> proxy;
  for (double q : kProxy) proxy.push_back(static_cast<float>(log(q)));
  ssa::SelectParams sp{SSA_METHOD_SSA_ADAPTIVE, 3, 0.4f, 1e-4f};
  ssa::SelectScratch scratch;
  ssa::Selection sel;
  // Over many seeds: H is always token 0, m = 2, and pi matches the example.
  int seen_pair_2_4 = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    ssa::select_tokens(sp, proxy.data(), proxy.size(), 0, ssa::make_rng_stream(seed, 0, 0, 0),
                       scratch, &sel);
    REQUIRE(sel.heavy == 1);
    CHECK(sel.tokens[0] == 0);
    CHECK(sel.draws == 2);
    for (size_t i = 1; i < sel.tokens.size(); ++i) {
      const double pi = exp(static_cast<double>(sel.log_pi[i]));
      CHECK(pi == doctest::Approx(sel.tokens[i] == 1 ? 0.64 : 0.36).epsilon(1e-5));
    }
    if (sel.unique == 2 && sel.tokens[1] == 1 && sel.tokens[2] == 3) ++seen_pair_2_4;
  }
  // P(draws are {2,4} in some order) = 2 * 0.4 * 0.2 = 0.16: seen about 32 times.
  CHECK(seen_pair_2_4 > 10);
  CHECK(seen_pair_2_4 < 60);
}
