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

namespace {

// select_tokens' selection made the long way, pass by pass, from the stages'
// own definitions: the max, every proposal weight, their fixed-point total, the
// top-k over all scores, each draw through the hierarchy by linear scans, the
// draws sorted and made unique.
ssa::Selection reference_selection(const ssa::SelectParams& p, const std::vector<float>& x, uint32_t base,
                                   const ssa::RngStream& rng) {
  const size_t n = x.size();
  ssa::Selection out;
  const bool residual = p.method != SSA_METHOD_PQ_TOPK && p.method != SSA_METHOD_ORACLE_TOPK;
  const float mx = *std::max_element(x.begin(), x.end());
  std::vector<float> w(n);
  ssa::proposal_weights(x.data(), n, mx, w.data());
  const uint64_t total = ssa::fixed_sum(w.data(), n);
  std::vector<uint32_t> heavy;
  if (p.method == SSA_METHOD_SSA_ADAPTIVE) {
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return x[a] > x[b]; });
    order.resize(p.kprime);
    std::vector<double> q(order.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<double>(w[order[i]]) / ssa::fixed_to_double(total);
    order.resize(ssa::adaptive_heavy_count(q.data(), q.size(), p.kprime));
    heavy = order;
  } else {
    ssa::topk_indices(x.data(), n, ssa::fixed_heavy_count(p.method, p.kprime, p.heavy_fraction), 0, &heavy);
  }
  std::sort(heavy.begin(), heavy.end());
  for (uint32_t j : heavy) {
    out.tokens.push_back(base + j);
    out.log_pi.push_back(0.0f);
  }
  out.heavy = heavy.size();
  if (!residual) return out;
  uint64_t heavy_total = 0;
  for (uint32_t j : heavy) heavy_total += ssa::fixed_weight(w[j]);
  out.residual_mass = ssa::residual_mass_of(total, heavy_total);
  ssa::residual_weights(p.method, w.data(), n);
  for (uint32_t j : heavy) w[j] = 0.0f;
  // The hierarchy's rule (fixed_point_sampler.h) by linear scans: chunks of
  // 1024 and blocks of 32 absolute tokens clipped to the candidates; at each
  // level the first entry whose running sum exceeds the draw's target, the last
  // one if none does.
  const uint64_t first = base, end = base + n;
  auto sum_of = [&](uint64_t t0, uint64_t t1) {
    uint64_t sum = 0;
    for (uint64_t t = t0; t < t1; ++t) sum += ssa::fixed_weight(w[t - first]);
    return sum;
  };
  std::vector<std::pair<uint64_t, uint64_t>> chunks;  // token ranges
  for (uint64_t t = first; t < end; t = std::min(end, (t / 1024 + 1) * 1024)) {
    chunks.push_back({t, std::min(end, (t / 1024 + 1) * 1024)});
  }
  std::vector<uint64_t> block_sum_at(end / 32 + 1);  // by absolute block
  for (uint64_t t = first; t < end; t = std::min(end, (t / 32 + 1) * 32)) {
    block_sum_at[t / 32] = sum_of(t, std::min(end, (t / 32 + 1) * 32));
  }
  std::vector<uint64_t> chunk_sums;
  uint64_t residual_total = 0;
  for (const auto& c : chunks) {
    chunk_sums.push_back(sum_of(c.first, c.second));
    residual_total += chunk_sums.back();
  }
  const uint64_t m = p.kprime - heavy.size();
  out.draws = m;
  std::vector<uint32_t> drawn;
  for (uint64_t j = 0; j < m && residual_total > 0; ++j) {
    const ssa::Philox4 r = ssa::rng_draw(rng, static_cast<uint32_t>(j));
    const uint64_t x = ssa::fixed_target(residual_total, r.v[0]);
    uint64_t run = 0;
    size_t c = 0;
    for (; c + 1 < chunks.size(); ++c) {
      run += chunk_sums[c];
      if (run > x) break;
    }
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // token ranges, with their sums below
    std::vector<uint64_t> block_sums;
    for (uint64_t t = chunks[c].first; t < chunks[c].second; t = std::min(chunks[c].second, (t / 32 + 1) * 32)) {
      blocks.push_back({t, std::min(chunks[c].second, (t / 32 + 1) * 32)});
      block_sums.push_back(block_sum_at[t / 32]);
    }
    const uint64_t t1 = ssa::fixed_target(chunk_sums[c], r.v[1]);
    run = 0;
    size_t b = 0;
    for (; b + 1 < blocks.size(); ++b) {
      run += block_sums[b];
      if (run > t1) break;
    }
    const uint64_t t2 = ssa::fixed_target(block_sums[b], r.v[2]);
    run = 0;
    uint64_t t = blocks[b].first;
    for (; t + 1 < blocks[b].second; ++t) {
      run += ssa::fixed_weight(w[t - first]);
      if (run > t2) break;
    }
    drawn.push_back(static_cast<uint32_t>(t));
  }
  std::sort(drawn.begin(), drawn.end());
  drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
  ssa::add_samples(drawn, w.data(), base, residual_total, m, p.pi_min, 0, &out);
  return out;
}

}  // namespace

TEST_CASE("select_tokens makes, bitwise, the selection of its stages run one pass at a time") {
  // Every method; candidate counts around a block (32) and a chunk (1024);
  // candidates starting anywhere in a block; budgets from 1 to n - 1; scores
  // with many ties, and scores whose top values crowd into few blocks (more
  // than the threshold's cap then pass it, and the whole-context top-k runs).
  std::mt19937 rng(29);
  std::normal_distribution<float> g(0.0f, 2.0f);
  int fallbacks = 0, cases = 0;
  for (ssa_method method : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                            SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    for (size_t n : {2u, 31u, 33u, 64u, 1000u, 1025u, 5000u, 70001u}) {
      for (int shape = 0; shape < 4; ++shape) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) {
          x[i] = g(rng);
          if (shape == 1) x[i] = std::round(x[i]);                                // ties
          if (shape == 2) x[i] = (i / 64) % 17 == 0 ? 8.0f + x[i] : x[i] - 4.0f;  // crowded tops
          if (shape == 3) x[i] = i % 1000 == 7 ? 2.0f : 1.0f;                     // one value nearly everywhere
        }
        const uint32_t base = static_cast<uint32_t>(rng() % 100);
        const uint64_t kprime = shape == 3 ? std::max<uint64_t>(1, n / 10) : 1 + rng() % (n - 1);
        const float h = std::uniform_real_distribution<float>(0.0f, 0.9f)(rng);
        const ssa::SelectParams sp{method, kprime, h, 1e-4f};
        const ssa::RngStream stream = ssa::make_rng_stream(3, static_cast<uint32_t>(n), shape, method);
        ssa::SelectScratch scratch;
        ssa::Selection got;
        ssa::select_tokens(sp, x.data(), n, base, stream, scratch, &got);
        const ssa::Selection want = reference_selection(sp, x, base, stream);
        ++cases;
        const uint64_t k = method == SSA_METHOD_SSA_ADAPTIVE ? kprime : ssa::fixed_heavy_count(method, kprime, h);
        fallbacks += k > 0 && (scratch.pass.n_above < k || scratch.pass.n_above > 4 * k + 1024) ? 1 : 0;
        CAPTURE(method);
        CAPTURE(n);
        CAPTURE(shape);
        CAPTURE(kprime);
        REQUIRE(got.heavy == want.heavy);
        CHECK(got.draws == want.draws);
        CHECK(got.unique == want.unique);
        CHECK(got.residual_mass == want.residual_mass);
        // Heavy tokens in any order, then the samples in token order.
        std::vector<uint32_t> heavy_got(got.tokens.begin(), got.tokens.begin() + got.heavy);
        std::sort(heavy_got.begin(), heavy_got.end());
        CHECK(heavy_got == std::vector<uint32_t>(want.tokens.begin(), want.tokens.begin() + want.heavy));
        CHECK(std::vector<uint32_t>(got.tokens.begin() + got.heavy, got.tokens.end()) ==
              std::vector<uint32_t>(want.tokens.begin() + want.heavy, want.tokens.end()));
        CHECK(got.log_pi == want.log_pi);
      }
    }
  }
  MESSAGE(fallbacks << " of " << cases << " selections took the whole-context top-k");
  CHECK(fallbacks > 0);
}
