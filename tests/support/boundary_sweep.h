// The boundary sweep: for every method, dtype, head dim and GQA ratio, a session
// grown token by token through the lengths at which a decode's shape changes (one
// token, a page, a partial page, the sink + local window, the index threshold, a
// sampler chunk) and decoded at each with budgets around every boundary (the
// sparsity rule, 1 token, the window - 1, exactly the window, window + 1, N - 1,
// N, > N), with and without group selection, one item at a time and as a batch
// mixing lengths. Every output is checked against a float64 reference built from
// the test's own copy of K/V:
//  - dense decodes (method DENSE, budget >= N, or a budget covering every
//    candidate): exact attention over the whole layer;
//  - window-only decodes (budget <= n_sink + n_local < N): attention over the sink
//    and local tokens alone (no proxy, no index needed, nothing scored);
//  - ORACLE_TOPK: attention over the window and the top k' candidates by exact
//    score;
//  - the proxy methods where the backend reports its read set (ssa_decode_traced:
//    the CPU backend): the Horvitz-Thompson estimator over the traced rows and
//    their log pi. Elsewhere their outputs must be finite, repeat bitwise, read no
//    more rows than the budget allows, and equal the batch's.
// The sweep runs through the public C API with a backend's own I/O (host memory
// on the CPU; device memory and asynchronous appends on CUDA), so the CPU suite
// and the GPU suite run the same cases.
#pragma once

#include <doctest/doctest.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "reference_attention.h"
#include "session_helpers.h"
#include "ssa.h"

namespace ssa_test::sweep {

struct Shape {
  ssa_dtype dtype;
  uint32_t head_dim, n_q_heads, n_kv_heads;
};

// One shape per dtype, each with another head dim and GQA ratio (SSA_SWEEP_DIAGONAL
// set: the sanitizers' runs).
inline std::vector<Shape> diagonal_shapes() {
  return {{SSA_DTYPE_F16, 64, 8, 8}, {SSA_DTYPE_BF16, 128, 8, 2}, {SSA_DTYPE_F32, 256, 8, 1}};
}

// Every dtype x head dims 64/128/256 x GQA ratios 1/4/8 (8 query heads).
inline std::vector<Shape> all_shapes() {
  std::vector<Shape> out;
  for (ssa_dtype t : {SSA_DTYPE_F16, SSA_DTYPE_BF16, SSA_DTYPE_F32})
    for (uint32_t d : {64u, 128u, 256u})
      for (uint32_t g : {1u, 4u, 8u}) out.push_back(Shape{t, d, 8, 8 / g});
  return out;
}

// The session's geometry: 64-token pages, a window of 16 + 112 = 128 tokens (two
// pages), the index trained at 256 tokens.
constexpr uint32_t kPage = 64, kSink = 16, kLocal = 112, kWindow = kSink + kLocal, kIndexMin = 256;

// Lengths in increasing order: 1, 2, inside the sink, one page +-1, a partial
// page, the window +-1, the index threshold +-1, past a 1024-token chunk.
inline std::vector<uint32_t> lengths(uint32_t max_len) {
  std::vector<uint32_t> out;
  for (uint32_t n : {1u, 2u, 17u, kPage - 1, kPage, kPage + 1, 100u, kWindow - 1, kWindow, kWindow + 1, 200u,
                     kIndexMin - 1, kIndexMin, kIndexMin + 1, 300u, 600u, 1100u})
    if (n <= max_len) out.push_back(n);
  return out;
}

// Budgets at length n (0: ceil(n / 50), the sparsity rule that crashed short
// prompts).
inline std::vector<uint32_t> budgets(uint32_t n) {
  std::vector<uint32_t> out = {0u, 1u, kWindow - 1, kWindow, kWindow + 1, kWindow + 9};
  if (n > 1) out.push_back(n - 1);
  out.push_back(n);
  out.push_back(n + 7);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// What a decode at length n with budget k must do (docs/ALGORITHM.md#fixed-tokens).
struct Expect {
  uint64_t sink_end, local_begin, kprime;
  bool dense, window_only;
};

inline Expect expect(uint64_t n, uint32_t budget, ssa_method m, uint32_t group) {
  Expect e{};
  const uint64_t k = budget != 0 ? budget : static_cast<uint64_t>(ceil(static_cast<double>(n) / 50.0));
  e.sink_end = std::min<uint64_t>(kSink, n);
  e.local_begin = std::max<uint64_t>(e.sink_end, n - std::min<uint64_t>(kLocal, n));
  const uint64_t fixed = e.sink_end + (n - e.local_begin), cand = e.local_begin - e.sink_end;
  e.kprime = k > fixed ? k - fixed : 0;
  // With group selection a KV group's rows serve all its q heads: G * k'.
  e.dense = m == SSA_METHOD_DENSE || k >= n || e.kprime >= cand || (group > 1 && e.kprime * group >= cand);
  e.window_only = !e.dense && e.kprime == 0;
  return e;
}

// A backend's I/O: appends and decodes of host bytes through the session's memory
// space.
struct Io {
  std::string name;
  ssa_runtime* rt = nullptr;
  uint32_t session_flags = 0;
  bool traced = false;  // the backend answers ssa_decode_traced
  // A batch item equals its decode alone bitwise (else within the dtype's
  // rounding: CUDA sizes its attention splits by the whole batch).
  bool batch_bitwise = true;
  // Appends n tokens; `async` through ssa_session_append_async where it differs.
  std::function<ssa_status(ssa_session*, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v, uint64_t n,
                           bool async)>
      append;
  // Decodes q (host bytes) into out (host bytes).
  std::function<ssa_status(ssa_session*, const std::vector<uint8_t>& q, std::vector<uint8_t>* out,
                           const ssa_decode_params&, ssa_decode_stats*)>
      decode;
  // One decode_batch of (session, q) items into outs.
  std::function<ssa_status(const std::vector<ssa_session*>&, const std::vector<uint8_t>& q,
                           std::vector<std::vector<uint8_t>>* outs, const ssa_decode_params&)>
      decode_batch;
};

inline double tolerance(ssa_dtype t) { return t == SSA_DTYPE_BF16 ? 1.6e-2 : t == SSA_DTYPE_F16 ? 2e-3 : 2e-5; }

// The test's copy of one shape's data: K/V [n][n_kv][d] and q [n_q][d], as floats
// and as the session's dtype rounds them.
struct Data {
  Shape shape;
  uint32_t max_len;
  std::vector<float> k, v, q;
  std::vector<double> kq, vq, qq;  // rounded to dtype
};

inline Data make_data(const Shape& s, uint32_t max_len, uint64_t seed) {
  Data d{s, max_len, {}, {}, {}, {}, {}, {}};
  const size_t row = size_t{s.n_kv_heads} * s.head_dim;
  d.k = random_vec(max_len * row, seed);
  d.v = random_vec(max_len * row, seed + 1);
  // Queries of norm ~2 sqrt(d): scores spread enough that top-k is not a coin toss.
  d.q = random_vec(size_t{s.n_q_heads} * s.head_dim, seed + 2, 2.0f);
  d.kq = quantised(d.k, s.dtype);
  d.vq = quantised(d.v, s.dtype);
  d.qq = quantised(d.q, s.dtype);
  return d;
}

// Attention of q head h over the rows `tokens` (log_pi: their log inclusion
// probabilities; empty = all 0), in float64.
inline std::vector<double> head_reference(const Data& d, uint32_t n, uint32_t h, const std::vector<uint32_t>& tokens,
                                          const std::vector<double>& log_pi) {
  const Shape& s = d.shape;
  const uint32_t kvh = h / (s.n_q_heads / s.n_kv_heads);
  const std::vector<double> K = head_rows(d.kq, n, s.n_kv_heads, s.head_dim, kvh);
  const std::vector<double> V = head_rows(d.vq, n, s.n_kv_heads, s.head_dim, kvh);
  const std::vector<double> lp = log_pi.empty() ? std::vector<double>(tokens.size(), 0.0) : log_pi;
  return ht_attention_f64(d.qq.data() + size_t{h} * s.head_dim, K.data(), V.data(), s.head_dim, tokens, lp);
}

inline std::vector<uint32_t> window_tokens(const Expect& e, uint32_t n) {
  std::vector<uint32_t> t;
  for (uint32_t i = 0; i < e.sink_end; ++i) t.push_back(i);
  for (uint32_t i = static_cast<uint32_t>(e.local_begin); i < n; ++i) t.push_back(i);
  return t;
}

// The window and the top k' candidates of q head h by exact score.
inline std::vector<uint32_t> oracle_tokens(const Data& d, const Expect& e, uint32_t n, uint32_t h) {
  const Shape& s = d.shape;
  const uint32_t kvh = h / (s.n_q_heads / s.n_kv_heads);
  std::vector<std::pair<double, uint32_t>> sc;
  for (uint32_t i = static_cast<uint32_t>(e.sink_end); i < e.local_begin; ++i) {
    double dot = 0;
    for (uint32_t j = 0; j < s.head_dim; ++j)
      dot += d.qq[size_t{h} * s.head_dim + j] * d.kq[(size_t{i} * s.n_kv_heads + kvh) * s.head_dim + j];
    sc.push_back({-dot, i});  // ascending: highest score first, then lowest index
  }
  std::sort(sc.begin(), sc.end());
  std::vector<uint32_t> t = window_tokens(e, n);
  for (uint64_t r = 0; r < e.kprime && r < sc.size(); ++r) t.push_back(sc[r].second);
  std::sort(t.begin(), t.end());
  return t;
}

inline bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

// Counts of what the sweep checked, for its report.
struct Tally {
  uint64_t decodes = 0, dense = 0, window_only = 0, oracle = 0, traced = 0, selecting_other = 0, batches = 0;
  Tally& operator+=(const Tally& o) {
    decodes += o.decodes;
    dense += o.dense;
    window_only += o.window_only;
    oracle += o.oracle;
    traced += o.traced;
    selecting_other += o.selecting_other;
    batches += o.batches;
    return *this;
  }
};

inline ssa_decode_params sweep_params(ssa_method m, uint32_t budget, uint32_t group, uint64_t step) {
  ssa_decode_params p = params(m, budget, 50.0f);
  p.n_sink = kSink;
  p.n_local = kLocal;
  p.step = step;
  p.group_selection = group;
  return p;
}

// The float64 references of one shape's dense and window-only decodes by length
// (every method and budget of that class shares them).
using RefCache = std::map<std::pair<uint32_t, bool>, std::vector<double>>;

// Checks one decode (already run: `out`, `stats`) against its reference.
inline void check_decode(const Io& io, ssa_session* s, const Data& d, uint32_t n, ssa_method m, uint32_t budget,
                         uint32_t group_mode, const std::vector<float>& out, const ssa_decode_stats& st,
                         const std::vector<uint8_t>& qb, Tally* tally, RefCache* refs) {
  const Shape& sh = d.shape;
  const uint32_t G = sh.n_q_heads / sh.n_kv_heads;
  const uint32_t group = group_mode == SSA_GROUP_OFF ? 1 : G;
  const Expect e = expect(n, budget, m, group);
  const double tol = tolerance(sh.dtype);
  const uint32_t nq = sh.n_q_heads, D = sh.head_dim;
  INFO(io.name, " dtype ", sh.dtype, " d ", D, " G ", G, " n ", n, " budget ", budget, " method ", m, " group ",
       group_mode, " dense ", e.dense, " window-only ", e.window_only, " k' ", e.kprime);
  REQUIRE(all_finite(out));
  CHECK(st.context_tokens == n);
  CHECK(st.window_only_heads == (e.window_only ? nq : 0u));
  if (e.dense || e.window_only || (m == SSA_METHOD_ORACLE_TOPK && group_mode == SSA_GROUP_OFF)) {
    const bool shared = e.dense || e.window_only;
    std::vector<double> fresh;
    std::vector<double>& ref = shared ? (*refs)[{n, e.dense}] : fresh;
    if (ref.empty()) {
      for (uint32_t h = 0; h < nq; ++h) {
        std::vector<uint32_t> t;
        if (e.dense) {
          for (uint32_t i = 0; i < n; ++i) t.push_back(i);
        } else if (e.window_only) {
          t = window_tokens(e, n);
        } else {
          t = oracle_tokens(d, e, n, h);
        }
        const std::vector<double> r = head_reference(d, n, h, t, {});
        ref.insert(ref.end(), r.begin(), r.end());
      }
    }
    CHECK(rel_l2(out.data(), ref.data(), ref.size()) < tol);
    const uint64_t per_head = e.dense ? n : e.window_only ? e.sink_end + (n - e.local_begin)
                                                           : e.sink_end + (n - e.local_begin) + e.kprime;
    CHECK(st.tokens_read == per_head * nq);
    if (!e.dense && !e.window_only) CHECK(st.heavy_tokens == e.kprime * nq);
    if (e.window_only) CHECK(st.scored_tokens == 0);
    (e.dense ? tally->dense : e.window_only ? tally->window_only : tally->oracle)++;
    return;
  }
  // A selecting proxy method (or ORACLE_TOPK with group selection).
  const uint64_t fixed = e.sink_end + (n - e.local_begin);
  CHECK(st.tokens_read <= (fixed + e.kprime * group) * nq);
  CHECK(st.tokens_read >= fixed * nq);
  if (!io.traced) {
    tally->selecting_other++;
    return;
  }
  ssa_decode_params p = sweep_params(m, budget, group_mode, 7);
  std::vector<uint32_t> tokens(size_t{nq} * n);
  std::vector<float> log_pi(tokens.size());
  std::vector<uint64_t> off(nq + 1);
  std::vector<uint8_t> ob(qb.size());
  REQUIRE(ssa_decode_traced(s, 0, qb.data(), ob.data(), &p, nullptr, tokens.data(), log_pi.data(), tokens.size(),
                            off.data()) == SSA_OK);
  // The traced decode is the same decode: bitwise the same output.
  CHECK(decode_bytes(ob, sh.dtype, out.size()) == out);
  std::vector<double> ref;
  for (uint32_t h = 0; h < nq; ++h) {
    const std::vector<uint32_t> t(tokens.begin() + off[h], tokens.begin() + off[h + 1]);
    const std::vector<double> lp(log_pi.begin() + off[h], log_pi.begin() + off[h + 1]);
    const std::vector<double> r = head_reference(d, n, h, t, lp);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  CHECK(rel_l2(out.data(), ref.data(), ref.size()) < tol);
  tally->traced++;
}

// The whole sweep for one shape on one backend. `partner` holds a layer of
// another length (decoded in each batch beside the growing session).
inline Tally run_shape(const Io& io, const Shape& sh, uint32_t max_len, uint64_t seed) {
  Tally tally;
  RefCache refs;
  const Data d = make_data(sh, max_len, seed);
  ssa_session_config c = make_config(1, sh.n_q_heads, sh.n_kv_heads, sh.head_dim, sh.dtype);
  c.page_tokens = kPage;
  c.index_min_tokens = kIndexMin;
  c.flags = io.session_flags;
  SessionPtr grow = make_session(io.rt, c), partner = make_session(io.rt, c);
  const size_t row = size_t{sh.n_kv_heads} * sh.head_dim, esz = sh.dtype == SSA_DTYPE_F32 ? 4 : 2;
  const std::vector<uint8_t> kb = encode(d.k, sh.dtype), vb = encode(d.v, sh.dtype), qb = encode(d.q, sh.dtype);
  auto slice = [&](const std::vector<uint8_t>& b, uint32_t from, uint32_t to) {
    return std::vector<uint8_t>(b.begin() + size_t{from} * row * esz, b.begin() + size_t{to} * row * esz);
  };
  // The partner: window + 1 tokens (selects one candidate at most budgets).
  const uint32_t partner_len = std::min<uint32_t>(kWindow + 1, max_len);
  REQUIRE(io.append(partner.get(), slice(kb, 0, partner_len), slice(vb, 0, partner_len), partner_len, false) ==
          SSA_OK);
  uint32_t have = 0, step_no = 0;
  for (uint32_t n : lengths(max_len)) {
    // Plain and asynchronous appends alternate; each lands mid-page somewhere.
    REQUIRE(io.append(grow.get(), slice(kb, have, n), slice(vb, have, n), n - have, (step_no++ & 1) != 0) == SSA_OK);
    have = n;
    for (uint32_t budget : budgets(n)) {
      for (ssa_method m : kAllMethods) {
        for (uint32_t gm : {uint32_t{SSA_GROUP_OFF}, uint32_t{SSA_GROUP_MEAN_QUERY}, uint32_t{SSA_GROUP_MIXTURE}}) {
          if (gm != SSA_GROUP_OFF && (m == SSA_METHOD_DENSE || sh.n_q_heads == sh.n_kv_heads)) continue;
          const ssa_decode_params p = sweep_params(m, budget, gm, 7);
          ssa_decode_stats st;
          ssa_decode_stats_init(&st);
          std::vector<uint8_t> ob(qb.size());
          const ssa_status status = io.decode(grow.get(), qb, &ob, p, &st);
          INFO(io.name, " n ", n, " budget ", budget, " method ", m, " group ", gm, ": ", ssa_last_error_message());
          REQUIRE(status == SSA_OK);
          const std::vector<float> out = decode_bytes(ob, sh.dtype, d.q.size());
          tally.decodes++;
          check_decode(io, grow.get(), d, n, m, budget, gm, out, st, qb, &tally, &refs);
          // The same call again: bitwise the same.
          std::vector<uint8_t> again(qb.size());
          REQUIRE(io.decode(grow.get(), qb, &again, p, nullptr) == SSA_OK);
          CHECK(again == ob);
          // A batch mixing this length with the partner's: each item as alone
          // (at the budgets where a session's class changes).
          if (budget != 0 && budget != kWindow + 1 && budget != n) continue;
          std::vector<std::vector<uint8_t>> outs;
          REQUIRE(io.decode_batch({grow.get(), partner.get(), grow.get()}, qb, &outs, p) == SSA_OK);
          std::vector<uint8_t> alone(qb.size());
          REQUIRE(io.decode(partner.get(), qb, &alone, p, nullptr) == SSA_OK);
          auto same = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
            if (io.batch_bitwise) return a == b;
            const std::vector<float> fa = decode_bytes(a, sh.dtype, d.q.size());
            const std::vector<float> fb = decode_bytes(b, sh.dtype, d.q.size());
            return all_finite(fa) && rel_l2(fa.data(), fb.data(), fb.size()) < tolerance(sh.dtype);
          };
          CHECK(same(outs[0], ob));
          CHECK(same(outs[1], alone));
          CHECK(same(outs[2], ob));
          tally.batches++;
        }
      }
    }
  }
  return tally;
}

// The shapes a sweep runs: every one, or the diagonal when SSA_SWEEP_DIAGONAL is set.
inline std::vector<Shape> sweep_shapes() {
  return getenv("SSA_SWEEP_DIAGONAL") != nullptr ? diagonal_shapes() : all_shapes();
}

inline void report(const std::string& name, const Tally& t) {
  MESSAGE(name, ": ", t.decodes, " decodes checked (", t.dense, " dense, ", t.window_only, " window-only, ",
          t.oracle, " oracle top-k, ", t.traced, " traced estimators, ", t.selecting_other,
          " other selecting decodes), ", t.batches, " mixed-length batches");
}

}  // namespace ssa_test::sweep
