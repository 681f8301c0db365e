// ssa_decode_traced through the public C API: the same output and stats as
// ssa_decode, every head's listed rows sorted, distinct and summing to
// tokens_read, every head's output the float64 HT estimator over exactly its
// listed rows and log_pi, shared rows under group selection, all rows for DENSE,
// and a trace buffer too small refused with nothing written but the offsets.
#include <doctest/doctest.h>

#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

struct Traced {
  std::vector<float> out;
  ssa_decode_stats stats;
  std::vector<uint32_t> tokens;
  std::vector<float> log_pi;
  std::vector<uint64_t> offsets;
};

Traced run_traced(ssa_session* s, const std::vector<uint8_t>& q, const ssa_decode_params& p, uint32_t nq,
                  uint64_t capacity) {
  Traced t;
  std::vector<float> out(q.size() / sizeof(float));
  ssa_decode_stats_init(&t.stats);
  t.tokens.assign(capacity, 0);
  t.log_pi.assign(capacity, 0.0f);
  t.offsets.assign(nq + 1, 0);
  SSA_CHECK_OK(ssa_decode_traced(s, 0, q.data(), out.data(), &p, &t.stats, t.tokens.data(), t.log_pi.data(),
                                 capacity, t.offsets.data()));
  t.out = out;
  return t;
}

bool same_stats(const ssa_decode_stats& a, const ssa_decode_stats& b) {
  return a.context_tokens == b.context_tokens && a.tokens_read == b.tokens_read &&
         a.heavy_tokens == b.heavy_tokens && a.draws == b.draws && a.unique_samples == b.unique_samples &&
         a.residual_proxy_mass == b.residual_proxy_mass && a.scored_tokens == b.scored_tokens &&
         a.target_budget == b.target_budget && a.capped_heads == b.capped_heads &&
         a.predicted_error == b.predicted_error && a.window_only_heads == b.window_only_heads;
}

ssa_decode_params base_params(ssa_method m, uint32_t group) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = m;
  p.sparsity = 20.0f;
  p.n_sink = 16;
  p.n_local = 48;
  p.seed = 99;
  p.step = 5;
  p.group_selection = group;
  return p;
}

}  // namespace

TEST_CASE("decode_traced: same output as ssa_decode; each head's rows are the HT estimator's rows") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 6, nkv = 2, g = nq / nkv;
  const size_t n = 12000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const auto Kq = quantised(ctx.K, SSA_DTYPE_F32), Vq = quantised(ctx.V, SSA_DTYPE_F32);
  const auto qq = quantised(ctx.q, SSA_DTYPE_F32);
  const auto qb = encode(ctx.q, SSA_DTYPE_F32);
  const uint64_t budget = (n + 19) / 20;
  for (uint32_t group : {uint32_t{SSA_GROUP_OFF}, uint32_t{SSA_GROUP_MIXTURE}, uint32_t{SSA_GROUP_MEAN_QUERY}}) {
    for (ssa_method m : kAllMethods) {
      CAPTURE(group);
      CAPTURE(m);
      const auto p = base_params(m, group);
      ssa_decode_stats ref_stats;
      ssa_decode_stats_init(&ref_stats);
      const auto ref_out = run_decode(s.get(), 0, ctx.q, SSA_DTYPE_F32, p, &ref_stats);
      const Traced t = run_traced(s.get(), qb, p, nq, uint64_t{nq} * n);
      CHECK(memcmp(t.out.data(), ref_out.data(), ref_out.size() * sizeof(float)) == 0);
      CHECK(same_stats(t.stats, ref_stats));
      CHECK(t.offsets[0] == 0);
      CHECK(t.offsets[nq] == t.stats.tokens_read);
      const bool grouped = group != SSA_GROUP_OFF && m != SSA_METHOD_DENSE;
      const uint64_t per_head_bound = grouped ? 16 + 48 + g * (budget - 16 - 48) : budget;
      for (uint32_t h = 0; h < nq; ++h) {
        CAPTURE(h);
        const std::vector<uint32_t> rows(t.tokens.begin() + t.offsets[h], t.tokens.begin() + t.offsets[h + 1]);
        const std::vector<double> log_pi(t.log_pi.begin() + t.offsets[h], t.log_pi.begin() + t.offsets[h + 1]);
        REQUIRE(!rows.empty());
        CHECK(std::adjacent_find(rows.begin(), rows.end(), [](uint32_t a, uint32_t b) { return a >= b; }) ==
              rows.end());
        CHECK(rows.back() < n);
        if (m == SSA_METHOD_DENSE) {
          CHECK(rows.size() == n);
          CHECK(std::all_of(log_pi.begin(), log_pi.end(), [](double x) { return x == 0.0; }));
        } else {
          CHECK(rows.size() <= per_head_bound);
          // Sink and local rows are listed with pi = 1.
          for (uint32_t i = 0; i < 16; ++i) CHECK((rows[i] == i && log_pi[i] == 0.0));
          for (uint32_t i = 0; i < 48; ++i) {
            const size_t at = rows.size() - 48 + i;
            CHECK((rows[at] == n - 48 + i && log_pi[at] == 0.0));
          }
          CHECK(std::all_of(log_pi.begin(), log_pi.end(), [](double x) { return x <= 0.0; }));
        }
        if (grouped) {
          const uint32_t first = (h / g) * g;
          CHECK(std::equal(rows.begin(), rows.end(), t.tokens.begin() + t.offsets[first],
                           t.tokens.begin() + t.offsets[first + 1]));
        }
        const auto Kh = head_rows(Kq, n, nkv, d, h / g), Vh = head_rows(Vq, n, nkv, d, h / g);
        const auto want = ht_attention_f64(&qq[h * d], Kh.data(), Vh.data(), d, rows, log_pi);
        const std::vector<double> got(t.out.begin() + h * d, t.out.begin() + (h + 1) * d);
        CHECK(rel_l2(got.data(), want.data(), d) < 2e-5);
      }
    }
  }
}

TEST_CASE("decode_traced: sampling traces change with the step and repeat with it") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 2, nkv = 1;
  const size_t n = 8000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const auto qb = encode(ctx.q, SSA_DTYPE_F32);
  auto p = base_params(SSA_METHOD_SSA, SSA_GROUP_OFF);
  const Traced a = run_traced(s.get(), qb, p, nq, uint64_t{nq} * n);
  const Traced b = run_traced(s.get(), qb, p, nq, uint64_t{nq} * n);
  p.step += 1;
  const Traced c = run_traced(s.get(), qb, p, nq, uint64_t{nq} * n);
  CHECK(a.tokens == b.tokens);
  CHECK(a.offsets == b.offsets);
  CHECK(a.tokens != c.tokens);
}

TEST_CASE("decode_traced: a capacity too small writes nothing but the offsets; NULLs and CUDA refused") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, nq = 4, nkv = 2;
  const size_t n = 6000;
  auto s = make_session(rt.get(), make_config(1, nq, nkv, d, SSA_DTYPE_F32));
  const auto ctx = make_structured_context(n, nkv, nq, d);
  append_f32(s.get(), 0, ctx.K, ctx.V, n, SSA_DTYPE_F32);
  const auto qb = encode(ctx.q, SSA_DTYPE_F32);
  const auto p = base_params(SSA_METHOD_SSA, SSA_GROUP_OFF);
  const Traced full = run_traced(s.get(), qb, p, nq, uint64_t{nq} * n);
  const uint64_t needed = full.offsets[nq];

  std::vector<float> out(nq * d, 7.0f);
  std::vector<uint32_t> tokens(needed, 0xABCDu);
  std::vector<float> log_pi(needed, 3.0f);
  std::vector<uint64_t> offsets(nq + 1, 0);
  ssa_decode_stats st;
  ssa_decode_stats_init(&st);
  st.tokens_read = 12345;
  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &p, &st, tokens.data(), log_pi.data(), needed - 1,
                          offsets.data()) == SSA_ERR_INVALID_ARGUMENT);
  const std::string msg = ssa_last_error_message();
  CHECK(msg.find(std::to_string(needed - 1)) != std::string::npos);
  CHECK(msg.find(std::to_string(needed)) != std::string::npos);
  CHECK(offsets == full.offsets);
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](uint32_t x) { return x == 0xABCDu; }));
  CHECK(std::all_of(log_pi.begin(), log_pi.end(), [](float x) { return x == 3.0f; }));
  CHECK(st.tokens_read == 12345);

  // Exactly the capacity reported: succeeds with the same rows; log_pi may be NULL.
  SSA_CHECK_OK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &p, nullptr, tokens.data(), nullptr, needed,
                                 offsets.data()));
  CHECK(offsets == full.offsets);
  CHECK(std::equal(tokens.begin(), tokens.end(), full.tokens.begin()));
  CHECK(memcmp(out.data(), full.out.data(), out.size() * sizeof(float)) == 0);

  // A size query: tokens NULL with capacity 0 reports the capacity in the offsets.
  std::fill(offsets.begin(), offsets.end(), 0);
  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &p, nullptr, nullptr, nullptr, 0, offsets.data()) ==
        SSA_ERR_INVALID_ARGUMENT);
  CHECK(offsets[nq] == needed);

  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &p, nullptr, nullptr, nullptr, 10, offsets.data()) ==
        SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &p, nullptr, tokens.data(), nullptr, needed,
                          nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_traced(nullptr, 0, qb.data(), out.data(), &p, nullptr, tokens.data(), nullptr, needed,
                          offsets.data()) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_traced(s.get(), 3, qb.data(), out.data(), &p, nullptr, tokens.data(), nullptr, needed,
                          offsets.data()) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), const_cast<uint8_t*>(qb.data()), &p, nullptr, tokens.data(),
                          nullptr, needed, offsets.data()) == SSA_ERR_INVALID_ARGUMENT);  // q and out overlap
  auto bad = p;
  bad.sparsity = 0.5f;
  std::fill(out.begin(), out.end(), 7.0f);
  CHECK(ssa_decode_traced(s.get(), 0, qb.data(), out.data(), &bad, nullptr, tokens.data(), nullptr, needed,
                          offsets.data()) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));

  ssa_runtime_options ro;
  ssa_runtime_options_init(&ro);
  ro.backend = SSA_BACKEND_CUDA;
  ssa_runtime* cuda = nullptr;
  if (ssa_runtime_create(&ro, &cuda) == SSA_OK) {
    ssa_session* cs = nullptr;
    auto c = make_config(1, nq, nkv, d, SSA_DTYPE_F32);
    c.flags = SSA_SESSION_HOST_POINTERS;
    SSA_CHECK_OK(ssa_session_create(cuda, &c, &cs));
    const auto kb = encode(ctx.K, SSA_DTYPE_F32), vb = encode(ctx.V, SSA_DTYPE_F32);
    SSA_CHECK_OK(ssa_session_append(cs, 0, kb.data(), vb.data(), n));
    CHECK(ssa_decode_traced(cs, 0, qb.data(), out.data(), &p, nullptr, tokens.data(), nullptr, needed,
                            offsets.data()) == SSA_ERR_UNSUPPORTED);
    CHECK(std::string(ssa_last_error_message()).find("CPU session") != std::string::npos);
    ssa_session_destroy(cs);
    ssa_runtime_destroy(cuda);
  }
}
