// Decode against float64 references: DENSE for every dtype and head dim, the
// sparse methods' outputs against the HT estimator over the rows they report
// reading, and the special cases that tie the methods together.
#include <doctest/doctest.h>

#include <math.h>

#include <random>
#include <vector>

#include "decode/decode.h"
#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

double tolerance_for(ssa_dtype t) {
  // The output is rounded to the dtype: half an ulp relative, plus float32 sums.
  return t == SSA_DTYPE_F32 ? 2e-5 : t == SSA_DTYPE_F16 ? 1e-3 : 8e-3;
}

}  // namespace

TEST_CASE("DENSE equals the float64 reference for every dtype and head dim (GQA)") {
  auto rt = make_runtime(2);
  for (ssa_dtype t : {SSA_DTYPE_F32, SSA_DTYPE_F16, SSA_DTYPE_BF16}) {
    for (uint32_t d : {64u, 128u, 256u}) {
      const uint32_t nq = 8, nkv = 2;
      const size_t n = 3000 + d;  // several pages, a partial last one, > one dense split at d=64
      CAPTURE(t);
      CAPTURE(d);
      auto c = make_config(2, nq, nkv, d, t);
      c.page_tokens = 128;
      auto s = make_session(rt.get(), c);
      const auto K = random_vec(n * nkv * d, 1 + d + t, 1.0f);
      const auto V = random_vec(n * nkv * d, 2 + d + t, 1.0f);
      const auto q = random_vec(nq * d, 3 + d + t, 2.0f);
      append_f32(s.get(), 1, K, V, n, t);
      const auto out = run_decode(s.get(), 1, q, t, params(SSA_METHOD_DENSE));
      const auto Kq = quantised(K, t), Vq = quantised(V, t), qq = quantised(q, t);
      double worst = 0.0;
      for (uint32_t h = 0; h < nq; ++h) {
        const auto Kh = head_rows(Kq, n, nkv, d, h / (nq / nkv));
        const auto Vh = head_rows(Vq, n, nkv, d, h / (nq / nkv));
        const auto ref = dense_attention_f64(&qq[h * d], Kh.data(), Vh.data(), n, d);
        std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
        worst = std::max(worst, rel_l2(got.data(), ref.data(), d));
      }
      CHECK(worst < tolerance_for(t));
    }
  }
}

TEST_CASE("every method with budget >= N is bitwise DENSE") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 1500;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F16));
  append_f32(s.get(), 0, random_vec(n * nkv * d, 1), random_vec(n * nkv * d, 2), n, SSA_DTYPE_F16);
  const auto q = random_vec(nq * d, 3, 2.0f);
  const auto dense = run_decode(s.get(), 0, q, SSA_DTYPE_F16, params(SSA_METHOD_DENSE));
  for (ssa_method m : kAllMethods) {
    CAPTURE(m);
    for (uint32_t budget : {uint32_t(n), uint32_t(n + 100)}) {
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const auto out = run_decode(s.get(), 0, q, SSA_DTYPE_F16, params(m, budget), &st);
      CHECK(out == dense);
      CHECK(st.tokens_read == n * nq);
    }
    // Sparsity 1 is the same request as budget N.
    CHECK(run_decode(s.get(), 0, q, SSA_DTYPE_F16, params(m, 0, 1.0f)) == dense);
  }
}

TEST_CASE("sparse methods compute exactly the HT estimator over the rows they read") {
  auto rt = make_runtime(2);
  const uint32_t d = 128, nq = 4, nkv = 2;
  const size_t n = 20000;
  auto c = make_config(1, nq, nkv, d, SSA_DTYPE_F32);
  auto s = make_session(rt.get(), c);
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const auto Kq = quantised(ctx.K, SSA_DTYPE_F32), Vq = quantised(ctx.V, SSA_DTYPE_F32);
  const auto qq = quantised(ctx.q, SSA_DTYPE_F32);
  for (ssa_method m : kAllMethods) {
    CAPTURE(m);
    auto p = params(m, 0, 20.0f);
    p.n_sink = 16;
    p.n_local = 64;
    std::vector<ssa::HeadTrace> traces;
    std::vector<float> out(nq * d);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    REQUIRE(ssa::decode(*s, 0, ctx.q.data(), out.data(), p, &st, &traces).ok());
    const uint64_t budget = (n + 19) / 20;
    uint64_t read = 0;
    for (uint32_t h = 0; h < nq; ++h) {
      const auto& tr = traces[h];
      read += tr.tokens.size();
      if (m != SSA_METHOD_DENSE) CHECK(tr.tokens.size() <= budget);
      // Sink and local always read with pi = 1.
      CHECK(tr.tokens[0] == 0);
      std::vector<double> log_pi(tr.log_pi.begin(), tr.log_pi.end());
      const auto Kh = head_rows(Kq, n, nkv, d, h / 2), Vh = head_rows(Vq, n, nkv, d, h / 2);
      const auto ref = ht_attention_f64(&qq[h * d], Kh.data(), Vh.data(), d, tr.tokens, log_pi);
      std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
      CHECK(rel_l2(got.data(), ref.data(), d) < 2e-5);
    }
    CHECK(st.tokens_read == read);
    CHECK(st.context_tokens == n);
    if (m == SSA_METHOD_SSA || m == SSA_METHOD_HYBRID_UNIFORM) {
      const uint64_t kprime = budget - 16 - 64;
      CHECK(st.heavy_tokens == nq * static_cast<uint64_t>(nearbyint(0.4 * kprime)));
      CHECK(st.draws == nq * (kprime - static_cast<uint64_t>(nearbyint(0.4 * kprime))));
      CHECK(st.unique_samples <= st.draws);
      CHECK(st.unique_samples > 0);
      CHECK(st.residual_proxy_mass > 0.0);
    }
    if (m == SSA_METHOD_PQ_TOPK || m == SSA_METHOD_ORACLE_TOPK) {
      CHECK(st.draws == 0);
      CHECK(st.tokens_read == nq * budget);
    }
  }
}

TEST_CASE("h = 1 is PQ_TOPK and h = 0 is SAMPLING, bitwise") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 1;
  const size_t n = 8000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_BF16));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_BF16);
  auto ssa1 = params(SSA_METHOD_SSA, 0, 10.0f);
  ssa1.heavy_fraction = 1.0f;
  CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_BF16, ssa1) ==
        run_decode(s.get(), 0, ctx.q, SSA_DTYPE_BF16, params(SSA_METHOD_PQ_TOPK, 0, 10.0f)));
  auto ssa0 = params(SSA_METHOD_SSA, 0, 10.0f);
  ssa0.heavy_fraction = 0.0f;
  CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_BF16, ssa0) ==
        run_decode(s.get(), 0, ctx.q, SSA_DTYPE_BF16, params(SSA_METHOD_SAMPLING, 0, 10.0f)));
}

TEST_CASE("a lossless PQ proxy makes PQ_TOPK equal ORACLE_TOPK") {
  // Keys take at most 4 distinct values per 4-dim subspace, so 256 centroids
  // represent them exactly; small integers and d = 64 (1/sqrt(d) = 1/8) keep
  // every score exact in float, so both proxies order tokens identically.
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 2, nkv = 1;
  const size_t n = 5000;
  auto c = make_config(1, nq, nkv, d, SSA_DTYPE_F32);
  auto s = make_session(rt.get(), c);
  std::mt19937 rng(3);
  std::vector<float> K(n * d), V(n * d), q(nq * d);
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t m = 0; m < 16; ++m) {
      const int pattern = rng() % 4;
      for (uint32_t j = 0; j < 4; ++j) K[t * d + m * 4 + j] = static_cast<float>(((pattern + j) % 4) - 1);
    }
  }
  for (auto& x : V) x = static_cast<float>(static_cast<int>(rng() % 9) - 4);
  for (auto& x : q) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  append_f32(s.get(), 0, K, V, n, SSA_DTYPE_F32);
  for (float sp : {5.0f, 20.0f, 50.0f}) {
    auto oracle = params(SSA_METHOD_ORACLE_TOPK, 0, sp);
    auto pq = params(SSA_METHOD_PQ_TOPK, 0, sp);
    oracle.n_sink = pq.n_sink = 8;
    oracle.n_local = pq.n_local = 8;
    std::vector<ssa::HeadTrace> to, tp;
    std::vector<float> oo(nq * d), op(nq * d);
    REQUIRE(ssa::decode(*s, 0, q.data(), oo.data(), oracle, nullptr, &to).ok());
    REQUIRE(ssa::decode(*s, 0, q.data(), op.data(), pq, nullptr, &tp).ok());
    for (uint32_t h = 0; h < nq; ++h) {
      auto a = to[h].tokens, b = tp[h].tokens;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      CHECK(a == b);
    }
    CHECK(oo == op);
  }
}

TEST_CASE("same seed and step reproduce bitwise; other steps differ; thread count does not matter") {
  // For every kind of proxy and for exact scores. One and two threads select
  // in a task per KV head (its heads scored together), three in a task per
  // query head: the outputs are the same bits.
  const uint32_t d = 128, nq = 8, nkv = 2;
  const size_t n = 12000;
  const auto ctx = make_structured_context(n, nkv, nq, d);
  const ssa_method methods[] = {SSA_METHOD_SSA,         SSA_METHOD_SSA_ADAPTIVE, SSA_METHOD_HYBRID_UNIFORM,
                                SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK,      SSA_METHOD_SAMPLING,
                                SSA_METHOD_DENSE};
  const size_t nm = sizeof methods / sizeof methods[0];
  for (ssa_proxy proxy : {SSA_PROXY_PQ, SSA_PROXY_PQ4, SSA_PROXY_QPQ}) {
    CAPTURE(proxy);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      auto rt = make_runtime(threads, 77);
      ssa_session_config c = make_config(1, nq, nkv, d, SSA_DTYPE_F16);
      c.proxy = proxy;
      if (proxy == SSA_PROXY_PQ4) {
        c.pq_subspaces = 32;
        c.pq_centroids = 16;
      }
      auto s = make_session(rt.get(), c);
      append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F16);
      for (ssa_method m : methods) {
        auto p = params(m, 0, 20.0f);
        p.step = 5;
        outs.push_back(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p));
        if (m != SSA_METHOD_DENSE && m != SSA_METHOD_ORACLE_TOPK && m != SSA_METHOD_PQ_TOPK && threads == 1) {
          p.step = 6;
          CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p) != outs.back());
          p.step = 5;
          p.seed = 77;  // explicit seed equal to the runtime's default
          CHECK(run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F16, p) == outs.back());
        }
      }
    }
    for (size_t i = nm; i < outs.size(); ++i) CHECK(outs[i] == outs[i % nm]);
  }
}
