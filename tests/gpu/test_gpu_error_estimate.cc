// The error estimate of an error-targeted round (kernels/error_estimate.cu)
// against float64 computed here from the rows the round read: the recorded draws
// (in range, never heavy, and exactly the unique samples the attention used),
// their proposal probabilities from the row's scores, and V by its definition
// (the sample variance of u_j = x_j (v_j - o), not the kernel's expanded moments).
#include <doctest/doctest.h>

#include <math.h>

#include <algorithm>
#include <set>
#include <vector>

#include "decode/decode_plan.h"
#include "kernels/error_estimate.h"
#include "lib/cuda/method_plan.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

float host_key_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

struct Round {
  cuda::DecodeBatch b{};
  Decoder dec;
  DevBuf<uint8_t> out, scratch;
  DevBuf<double> V;
};

void run_round(Round& r, const TestLayer& t, ssa_method m, uint32_t budget, uint32_t sink, uint64_t step) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = m;
  p.budget = budget;
  p.n_sink = sink;
  p.n_local = 128;
  p.step = step;
  p.seed = 99;
  const DecodePlan plan = plan_decode(t.n, p);
  r.b = cuda::DecodeBatch{};
  r.b.shape = shape_of(t.L);
  r.b.n_items = 1;
  cuda::set_method(m, &r.b);
  if (plan.dense) r.b.proxy = cuda::Proxy::kNone;
  r.b.pi_min = p.pi_min;
  r.b.seed = p.seed;
  r.b.step = step;
  r.b.layer = 2;
  r.b.record_draws = true;
  const size_t out_bytes = size_t{t.L.n_q_heads} * t.L.row_bytes();
  r.out = DevBuf<uint8_t>(out_bytes);
  r.b.items[0] = item_of(t, r.out.p);
  cuda::plan_item(plan, p, t.L.group_size(), &r.b.items[0]);
  CUDA_OK(r.dec.run(&r.b));
  if (r.b.proxy == cuda::Proxy::kNone) return;
  r.scratch = DevBuf<uint8_t>(cuda::estimate_scratch_bytes(r.b, r.dec.plan));
  r.V = DevBuf<double>(r.dec.plan.rows);
  CUDA_OK(cuda::launch_error_estimate(r.b, r.dec.plan, r.dec.ws, r.scratch.p, r.V.p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
}

template <typename T>
std::vector<T> fetch(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n) CUDA_OK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// V of head h by its definition, in float64, from the rows the round read; also
// checks the recorded draws against the row's unique samples and heavy set.
double reference_V(const Round& r, const TestLayer& t, uint32_t h) {
  const cuda::DecodeItem& it = r.b.items[0];
  const cuda::Workspace& ws = r.dec.ws;
  const cuda::RowState st = fetch(ws.rows + h, 1)[0];
  const size_t sel = it.select_base + size_t{h} * it.select_cap;
  const auto heavy = fetch(ws.heavy + sel, st.n_heavy);
  const auto uniq = fetch(ws.uniq_sorted + sel, st.n_unique);
  const auto draws = fetch(ws.draw_tokens + sel, st.n_draws);
  const auto scores = fetch(ws.scores + it.score_base + size_t{h} * it.n_pad, it.n_tokens);
  const std::set<uint32_t> heavy_set(heavy.begin(), heavy.end());
  std::set<uint32_t> drawn;
  for (uint32_t tok : draws) {
    CHECK(tok >= it.sink_end);
    CHECK(tok < it.local_begin);
    CHECK(heavy_set.count(tok) == 0);
    drawn.insert(tok);
  }
  CHECK(std::vector<uint32_t>(drawn.begin(), drawn.end()) == uniq);
  // The residual's fixed-point total, as the sampler summed it.
  const float mx = host_key_float(st.max_key);
  auto fixed_weight = [&](uint32_t tok) {
    const float e = expf(scores[tok] - mx);
    return static_cast<double>(nearbyint(static_cast<double>(e * 274877906944.0f)));
  };
  double total = 0;
  for (uint32_t tok = it.sink_end; tok < it.local_begin; ++tok)
    if (!heavy_set.count(tok) && scores[tok] != -INFINITY) total += fixed_weight(tok);
  CHECK(fabs(total - st.w_total) <= 1e-6 * st.w_total + 64.0);

  const uint32_t d = t.L.head_dim, kvh = h / t.L.group_size();
  const std::vector<double> q = scaled_q(t, h);
  auto value = [&](uint32_t tok) { return t.v.data() + (size_t{tok} * t.L.n_kv_heads + kvh) * d; };
  std::vector<uint32_t> exact;
  for (uint32_t tok = 0; tok < it.sink_end; ++tok) exact.push_back(tok);
  for (uint32_t tok = it.local_begin; tok < it.n_tokens; ++tok) exact.push_back(tok);
  exact.insert(exact.end(), heavy.begin(), heavy.end());
  // One shift M for everything (the largest logit read), so the sums compare.
  double M = -INFINITY;
  for (uint32_t tok : exact) M = std::max(M, exact_logit(t, h, tok, q));
  for (uint32_t tok : draws) M = std::max(M, exact_logit(t, h, tok, q));
  double ZE = 0;
  std::vector<double> YE(d, 0.0);
  for (uint32_t tok : exact) {
    const double w = exp(exact_logit(t, h, tok, q) - M);
    ZE += w;
    for (uint32_t j = 0; j < d; ++j) YE[j] += w * value(tok)[j];
  }
  const size_t m = draws.size();
  if (m < 2) return INFINITY;
  std::vector<double> x(m);
  double S0 = 0;
  std::vector<double> S1(d, 0.0);
  for (size_t j = 0; j < m; ++j) {
    x[j] = exp(exact_logit(t, h, draws[j], q) - M) / (fixed_weight(draws[j]) / st.w_total);
    S0 += x[j];
    for (uint32_t i = 0; i < d; ++i) S1[i] += x[j] * value(draws[j])[i];
  }
  const double Z = ZE + S0 / m;
  std::vector<double> o(d);
  double oo = 0;
  for (uint32_t i = 0; i < d; ++i) {
    o[i] = (YE[i] + S1[i] / m) / Z;
    oo += o[i] * o[i];
  }
  std::vector<std::vector<double>> u(m, std::vector<double>(d));
  std::vector<double> ubar(d, 0.0);
  for (size_t j = 0; j < m; ++j)
    for (uint32_t i = 0; i < d; ++i) {
      u[j][i] = x[j] * (value(draws[j])[i] - o[i]);
      ubar[i] += u[j][i] / m;
    }
  double s2 = 0;
  for (size_t j = 0; j < m; ++j)
    for (uint32_t i = 0; i < d; ++i) s2 += (u[j][i] - ubar[i]) * (u[j][i] - ubar[i]);
  s2 /= static_cast<double>(m - 1);
  return s2 / (Z * Z * oo);
}

TEST_CASE("gpu error estimate: V per head matches float64 over the rows the round read") {
  SSA_GPU_TEST_OR_SKIP();
  struct Cell {
    uint32_t d;
    DType dt;
    uint32_t n, sink;
  };
  for (const Cell c : {Cell{128, DType::kF16, 6000, 127}, Cell{64, DType::kBF16, 40000, 128},
                       Cell{256, DType::kF16, 20000, 128}, Cell{64, DType::kF32, 9000, 16},
                       Cell{512, DType::kF16, 8000, 128}}) {
    for (ssa_method m : {SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      CAPTURE(c.d);
      CAPTURE(c.n);
      CAPTURE(m);
      TestLayer t;
      build_layer(t, 8, 2, c.d, c.dt, c.n, 256, c.dt == DType::kF32 ? 8 : 16, 64, c.n * 3 + c.d + m);
      Round r;
      // Past the window (sink + 128 local tokens): the round draws.
      const uint32_t budget = std::max<uint32_t>(c.n / 25, c.sink + 128 + 512);
      run_round(r, t, m, budget, c.sink, 4);
      REQUIRE(r.b.proxy != cuda::Proxy::kNone);
      const auto V = fetch(r.V.p, t.L.n_q_heads);
      for (uint32_t h = 0; h < t.L.n_q_heads; ++h) {
        CAPTURE(h);
        const double ref = reference_V(r, t, h);
        CAPTURE(ref);
        CAPTURE(V[h]);
        REQUIRE(std::isfinite(ref));
        CHECK(V[h] > 0.0);
        CHECK(fabs(V[h] - ref) <= 1e-4 * ref);
      }
      // The same round again: the same bits.
      Round r2;
      run_round(r2, t, m, budget, c.sink, 4);
      CHECK(fetch(r2.V.p, t.L.n_q_heads) == V);
    }
  }
}

TEST_CASE("gpu error estimate: a dense item in the batch gives V = 0") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 4, 2, 128, DType::kF16, 5000, 256, 16, 64, 5);
  Round r;
  run_round(r, t, SSA_METHOD_SSA, 1000, 128, 1);  // past the window: item 0 draws
  // Item 0 sparse; a copy of it made dense (sink_end = local_begin = n).
  cuda::DecodeBatch b = r.b;
  b.n_items = 2;
  b.items[1] = item_of(t, r.out.p);
  b.items[1].sink_end = b.items[1].local_begin = t.n;
  Decoder dec;
  DevBuf<uint8_t> out2(size_t{t.L.n_q_heads} * t.L.row_bytes());
  b.items[0].out = out2.p;
  b.items[1].out = r.out.p;
  CUDA_OK(dec.run(&b));
  DevBuf<uint8_t> scratch(cuda::estimate_scratch_bytes(b, dec.plan));
  DevBuf<double> V(dec.plan.rows);
  CUDA_OK(cuda::launch_error_estimate(b, dec.plan, dec.ws, scratch.p, V.p, nullptr));
  const auto v = fetch(V.p, dec.plan.rows);
  for (uint32_t h = 0; h < t.L.n_q_heads; ++h) {
    CHECK(v[h] > 0.0);
    CHECK(std::isfinite(v[h]));
    CHECK(v[t.L.n_q_heads + h] == 0.0);
  }
  // Not for a batch without recorded draws.
  b.record_draws = false;
  CHECK(cuda::launch_error_estimate(b, dec.plan, dec.ws, scratch.p, V.p, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssa::gputest
