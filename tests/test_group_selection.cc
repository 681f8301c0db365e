// Selection once per KV group (ssa_decode_params.group_selection): a group of one
// is bitwise the per-head selection, a budget >= N is DENSE, every head's output
// is the float64 HT estimator over the group's shared rows, and every head's HT
// numerator and denominator are unbiased under both group proposals.
#include <doctest/doctest.h>

#include <math.h>

#include <algorithm>
#include <string>
#include <vector>

#include "decode/decode.h"
#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

constexpr ssa_method kSelecting[] = {SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK,
                                     SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING,
                                     SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE};
constexpr ssa_method kSampling[] = {SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                                    SSA_METHOD_SSA_ADAPTIVE};
constexpr uint32_t kGroupModes[] = {SSA_GROUP_MIXTURE, SSA_GROUP_MEAN_QUERY};

ssa_decode_params group_params(ssa_method m, uint32_t mode, float sparsity) {
  auto p = params(m, 0, sparsity);
  p.group_selection = mode;
  p.n_sink = 16;
  p.n_local = 32;
  return p;
}

}  // namespace

TEST_CASE("group selection: a group of one selects and decodes bitwise as a head alone") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 4;
  const size_t n = 9000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F16));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);
  for (ssa_method m : kSelecting) {
    for (uint32_t mode : kGroupModes) {
      CAPTURE(m);
      CAPTURE(mode);
      auto off = group_params(m, SSA_GROUP_OFF, 20.0f), grp = group_params(m, mode, 20.0f);
      off.step = grp.step = 3;
      std::vector<ssa::HeadTrace> to, tg;
      std::vector<uint16_t> oo(nq * d), og(nq * d);
      REQUIRE(ssa::decode(*s, 0, encode(ctx.q, SSA_DTYPE_F16).data(), oo.data(), off, nullptr, &to).ok());
      REQUIRE(ssa::decode(*s, 0, encode(ctx.q, SSA_DTYPE_F16).data(), og.data(), grp, nullptr, &tg).ok());
      CHECK(oo == og);
      for (uint32_t h = 0; h < nq; ++h) {
        CHECK(to[h].tokens == tg[h].tokens);
        CHECK(to[h].log_pi == tg[h].log_pi);
      }
    }
  }
}

TEST_CASE("group selection: a budget >= N is bitwise DENSE") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 2500;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_BF16));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 11), random_vec(n * nkv * d, 12), n, SSA_DTYPE_BF16);
  const auto q = random_vec(nq * d, 13, 2.0f);
  const auto dense = run_decode(s.get(), 0, q, SSA_DTYPE_BF16, params(SSA_METHOD_DENSE));
  for (ssa_method m : kSelecting) {
    for (uint32_t mode : kGroupModes) {
      CAPTURE(m);
      CAPTURE(mode);
      auto p = params(m, uint32_t(n));
      p.group_selection = mode;
      CHECK(run_decode(s.get(), 0, q, SSA_DTYPE_BF16, p) == dense);
    }
  }
}

TEST_CASE("group selection: a budget of the sink and local rows only scores nothing, even without an index") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 8, nkv = 2;
  const size_t n = 1500;  // shorter than index_min_tokens: no PQ index
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 21), random_vec(n * nkv * d, 22), n, SSA_DTYPE_F32);
  const auto q = random_vec(nq * d, 23, 2.0f);
  for (ssa_method m : kSelecting) {
    auto off = params(m, 256);  // = n_sink + n_local (128 each)
    ssa_decode_stats so;
    ssa_decode_stats_init(&so);
    const auto want = run_decode(s.get(), 0, q, SSA_DTYPE_F32, off, &so);
    for (uint32_t mode : kGroupModes) {
      CAPTURE(m);
      CAPTURE(mode);
      auto p = off;
      p.group_selection = mode;
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      CHECK(run_decode(s.get(), 0, q, SSA_DTYPE_F32, p, &st) == want);
      CHECK(st.tokens_read == uint64_t{256} * nq);
      CHECK(st.scored_tokens == 0);
      CHECK(st.window_only_heads == nq);
      CHECK(st.scored_tokens == so.scored_tokens);
    }
  }
}

TEST_CASE("group selection: every head reads the group's rows and equals the float64 HT estimator") {
  auto rt = make_runtime(2);
  const uint32_t d = 128, nq = 8, nkv = 2, g = nq / nkv;
  const size_t n = 20000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const auto Kq = quantised(ctx.K, SSA_DTYPE_F32), Vq = quantised(ctx.V, SSA_DTYPE_F32);
  const auto qq = quantised(ctx.q, SSA_DTYPE_F32);
  for (ssa_method m : kSelecting) {
    for (uint32_t mode : kGroupModes) {
      CAPTURE(m);
      CAPTURE(mode);
      const auto p = group_params(m, mode, 50.0f);
      std::vector<ssa::HeadTrace> traces;
      std::vector<float> out(nq * d);
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      REQUIRE(ssa::decode(*s, 0, ctx.q.data(), out.data(), p, &st, &traces).ok());
      const uint64_t kprime = (n + 49) / 50 - 16 - 32;
      uint64_t read = 0;
      for (uint32_t h = 0; h < nq; ++h) {
        const auto& tr = traces[h];
        read += tr.tokens.size();
        // The group's budget: g * k' middle rows, shared by all of its heads.
        CHECK(tr.tokens.size() <= 16 + 32 + g * kprime);
        CHECK(tr.tokens == traces[(h / g) * g].tokens);
        CHECK(tr.log_pi == traces[(h / g) * g].log_pi);
        std::vector<double> log_pi(tr.log_pi.begin(), tr.log_pi.end());
        const auto Kh = head_rows(Kq, n, nkv, d, h / g), Vh = head_rows(Vq, n, nkv, d, h / g);
        const auto ref = ht_attention_f64(&qq[h * d], Kh.data(), Vh.data(), d, tr.tokens, log_pi);
        std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
        CHECK(rel_l2(got.data(), ref.data(), d) < 2e-5);
      }
      CHECK(st.tokens_read == read);
      // Scores computed: one pass per KV head for the mean query, g for the mixture.
      const uint64_t nc = n - 16 - 32;
      CHECK(st.scored_tokens == (mode == SSA_GROUP_MEAN_QUERY ? nkv * nc : nq * nc));
      if (m == SSA_METHOD_PQ_TOPK || m == SSA_METHOD_ORACLE_TOPK) {
        CHECK(st.heavy_tokens == nq * g * kprime);
      }
    }
  }
}

TEST_CASE("group selection: every head's HT numerator and denominator are unbiased (Monte Carlo)") {
  // Exact logits and values from the test's own float64 copy; the estimator's
  // pieces summed over each trace (heavy rows pi = 1, draws their pi).
  auto rt = make_runtime(2);
  const uint32_t d = 32, nq = 4, nkv = 1;
  const size_t n = 3000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  const auto K = random_vec(n * d, 31, 1.0f), V = random_vec(n * d, 32, 1.0f);
  append_f32(s.get(), 0, K, V, n, SSA_DTYPE_F32);
  const auto q = random_vec(nq * d, 33, 2.5f);
  std::vector<std::vector<double>> w(nq, std::vector<double>(n));
  std::vector<double> true_den(nq, 0.0), true_num(nq, 0.0);
  for (uint32_t h = 0; h < nq; ++h) {
    for (size_t t = 0; t < n; ++t) {
      double dot = 0.0;
      for (uint32_t j = 0; j < d; ++j) dot += double(q[h * d + j]) * K[t * d + j];
      w[h][t] = exp(dot / sqrt(double(d)));
      true_den[h] += w[h][t];
      true_num[h] += w[h][t] * V[t * d];
    }
  }
  for (ssa_method m : kSampling) {
    for (uint32_t mode : kGroupModes) {
      CAPTURE(m);
      CAPTURE(mode);
      auto p = group_params(m, mode, 40.0f);
      p.pi_min = 1e-12f;
      const int trials = 1500;
      std::vector<double> sd(nq), sd2(nq), sn(nq), sn2(nq);
      std::vector<float> out(nq * d);
      for (int t = 0; t < trials; ++t) {
        p.step = static_cast<uint64_t>(t);
        std::vector<ssa::HeadTrace> traces;
        REQUIRE(ssa::decode(*s, 0, q.data(), out.data(), p, nullptr, &traces).ok());
        for (uint32_t h = 0; h < nq; ++h) {
          double den = 0.0, num = 0.0;
          for (size_t r = 0; r < traces[h].tokens.size(); ++r) {
            const uint32_t tok = traces[h].tokens[r];
            const double hw = w[h][tok] / exp(double(traces[h].log_pi[r]));
            den += hw;
            num += hw * V[size_t{tok} * d];
          }
          sd[h] += den;
          sd2[h] += den * den;
          sn[h] += num;
          sn2[h] += num * num;
        }
      }
      double worst_z = 0.0;
      for (uint32_t h = 0; h < nq; ++h) {
        const double mden = sd[h] / trials, mnum = sn[h] / trials;
        const double se_den = sqrt(std::max(0.0, sd2[h] / trials - mden * mden) / trials);
        const double se_num = sqrt(std::max(0.0, sn2[h] / trials - mnum * mnum) / trials);
        CAPTURE(h);
        CHECK(fabs(mden - true_den[h]) < 5.0 * se_den + 1e-6 * true_den[h]);
        CHECK(fabs(mnum - true_num[h]) < 5.0 * se_num + 1e-6 * fabs(true_num[h]));
        CHECK(se_den < 0.05 * true_den[h]);  // the test has power
        worst_z = std::max({worst_z, fabs(mden - true_den[h]) / se_den, fabs(mnum - true_num[h]) / se_num});
      }
      MESSAGE("method " << m << " group mode " << mode << ": largest |bias| / SE over " << nq
                        << " heads' numerators and denominators = " << worst_z);
    }
  }
}

TEST_CASE("group selection: bad values and unsupported combinations are refused, out untouched") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 3000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 41), random_vec(n * nkv * d, 42), n, SSA_DTYPE_F32);
  const auto q = random_vec(nq * d, 43);
  std::vector<float> out(nq * d, 7.0f);
  auto p = params(SSA_METHOD_SSA, 0, 20.0f);
  for (uint32_t bad : {3u, 0x7fffffffu, 0xffffffffu}) {
    p.group_selection = bad;
    CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(std::string(ssa_last_error_message()).find("group_selection") != std::string::npos);
  }
  p.group_selection = SSA_GROUP_MIXTURE;
  p.target_error = 0.05f;
  CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, nullptr) == SSA_ERR_UNSUPPORTED);
  CHECK(std::string(ssa_last_error_message()).find("group_selection") != std::string::npos);
  for (float x : out) CHECK(x == 7.0f);
}
