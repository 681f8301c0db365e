// The 4-bit proxies (SSA_PROXY_PQ4, _OPQ4): the register-table scorer of every
// kernel set against a scalar integer reference on random tables and codes, the
// 8-bit table against its documented rounding and the float table, the packed
// codes and scores of sessions against float64 references built from their own
// codebooks, decodes reading exactly the 4-bit proxy's top k', and the configs
// they refuse.
#include <doctest/doctest.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <shared_mutex>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "decode/candidate_scores.h"
#include "decode/quantized_lut.h"
#include "session.h"
#include "support/pq_reference.h"
#include "support/session_helpers.h"

using namespace ssa_test;

namespace {

// Integer sums of unpacked codes ([M][n], one code per byte), then fmaf: the
// contract of Kernels::pq4_scores written out independently.
std::vector<float> reference_pq4(const std::vector<uint8_t>& lut, uint32_t M, const std::vector<uint8_t>& codes,
                                 size_t n, float scale, float bias) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t sum = 0;
    for (uint32_t m = 0; m < M; ++m) sum += lut[size_t{m} * 16 + codes[size_t{m} * n + i]];
    out[i] = fmaf(scale, static_cast<float>(sum), bias);
  }
  return out;
}

// Packs [M][n] codes into M / 2 rows of `stride` bytes starting at column
// `offset`: low nibble subspace 2r, high nibble 2r + 1 (kv_layout.h).
std::vector<uint8_t> pack_rows(const std::vector<uint8_t>& codes, uint32_t M, size_t n, size_t stride,
                               size_t offset, std::mt19937_64& rng) {
  std::vector<uint8_t> rows(size_t{M / 2} * stride);
  for (uint8_t& b : rows) b = static_cast<uint8_t>(rng());  // bytes outside [offset, offset + n) are noise
  for (uint32_t r = 0; r < M / 2; ++r)
    for (size_t i = 0; i < n; ++i)
      rows[r * stride + offset + i] =
          static_cast<uint8_t>(codes[size_t{2 * r} * n + i] | (codes[size_t{2 * r + 1} * n + i] << 4));
  return rows;
}

std::vector<const ssa::simd::Kernels*> kernel_sets() {
  std::vector<const ssa::simd::Kernels*> sets = {&ssa::simd::generic_kernels()};
  if (ssa::simd::avx2_kernels() != nullptr) sets.push_back(ssa::simd::avx2_kernels());
  if (ssa::simd::avx512_kernels() != nullptr) sets.push_back(ssa::simd::avx512_kernels());
  return sets;
}

}  // namespace

TEST_CASE("pq4_scores: every kernel set gives the integer reference's bits, tails and strides included") {
  std::mt19937_64 rng(41);
  const auto sets = kernel_sets();
  MESSAGE("kernel sets: " << sets.size() << " (best: " << std::string(sets.back()->name) << ")");
  size_t compared = 0;
  for (uint32_t M : {2u, 4u, 32u, 64u, 256u}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t{32}, size_t{33}, size_t{64},
                     size_t{95}, size_t{300}}) {
      for (int extreme = 0; extreme < 2; ++extreme) {
        CAPTURE(M);
        CAPTURE(n);
        CAPTURE(extreme);
        std::vector<uint8_t> lut(size_t{M} * 16), codes(size_t{M} * n);
        // extreme: every entry 255 and every code 15, the largest sum (M x 255).
        for (uint8_t& x : lut) x = extreme ? 255 : static_cast<uint8_t>(rng());
        for (uint8_t& c : codes) c = extreme ? 15 : static_cast<uint8_t>(rng() % 16);
        const size_t offset = 3 + rng() % 5, stride = offset + n + rng() % 40;
        const std::vector<uint8_t> rows = pack_rows(codes, M, n, stride, offset, rng);
        const float scale = 0.0137f * static_cast<float>(1 + rng() % 7), bias = -3.71f + static_cast<float>(rng() % 5);
        const std::vector<float> want = reference_pq4(lut, M, codes, n, scale, bias);
        for (const ssa::simd::Kernels* k : sets) {
          CAPTURE(k->name);
          std::vector<float> got(n + 1, 12345.0f);
          k->pq4_scores(lut.data(), M, rows.data() + offset, stride, n, scale, bias, got.data());
          CHECK((n == 0 || memcmp(got.data(), want.data(), n * sizeof(float)) == 0));  // no pointer of an empty vector
          CHECK(got[n] == 12345.0f);  // nothing written past count
          ++compared;
        }
      }
    }
  }
  CHECK(compared >= 90);
}

TEST_CASE("pq4_scores: scale * sum + bias is rounded once (fmaf), double-rounding traps and random triples") {
  const auto sets = kernel_sets();
  // 3303821 * 2^-25 * 325 + 2^29 = 2^29 + 32 + 2^-25: rounding to double first
  // lands on the float midpoint 2^29 + 32 (then ties-to-even gives 2^29); the
  // single rounding gives 2^29 + 64. And the mirror below the midpoint.
  struct Trap {
    float scale, bias;
    uint8_t a, b;  // table entries of the two subspaces, sum a + b
    float want;
  };
  const float s = ldexpf(3303821.0f, -25);
  const Trap traps[] = {{s, ldexpf(1.0f, 29), 255, 70, ldexpf(1.0f, 29) + 64.0f},
                        {-s, ldexpf(1.0f, 29) + 64.0f, 255, 70, ldexpf(1.0f, 29)}};
  for (const Trap& t : traps) {
    CHECK(fmaf(t.scale, 325.0f, t.bias) == t.want);  // the reference itself
    std::vector<uint8_t> lut(32, 0);
    lut[0] = t.a;
    lut[16] = t.b;
    const uint8_t codes[1] = {0};
    for (const ssa::simd::Kernels* k : sets) {
      CAPTURE(std::string(k->name));
      float got = 0.0f;
      k->pq4_scores(lut.data(), 2, codes, 1, 1, t.scale, t.bias, &got);
      CHECK(got == t.want);
    }
  }
  // Random scales and biases over many exponents, against fmaf.
  std::mt19937_64 rng(43);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const size_t n = 4096;
  std::vector<uint8_t> lut(32), codes(n);
  size_t compared = 0;
  for (int trial = 0; trial < 64; ++trial) {
    for (uint8_t& x : lut) x = static_cast<uint8_t>(rng());
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
    const float scale = ldexpf(mant(rng), static_cast<int>(rng() % 40) - 30) * (rng() % 2 ? 1.0f : -1.0f);
    const float bias = ldexpf(mant(rng), static_cast<int>(rng() % 50) - 20) * (rng() % 2 ? 1.0f : -1.0f);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i)
      want[i] = fmaf(scale, static_cast<float>(lut[codes[i] & 15] + lut[16 + (codes[i] >> 4)]), bias);
    for (const ssa::simd::Kernels* k : sets) {
      std::vector<float> got(n);
      k->pq4_scores(lut.data(), 2, codes.data(), n, n, scale, bias, got.data());
      CHECK(memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      compared += n;
    }
  }
  CHECK(compared >= 64 * n);
}

TEST_CASE("quantize_lut: the documented rounding, and scores within M scale / 2 of the float table's") {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd;
  for (uint32_t K : {16u, 5u}) {
    for (uint32_t M : {2u, 32u, 64u}) {
      CAPTURE(K);
      CAPTURE(M);
      std::vector<float> lut(size_t{M} * K);
      for (uint32_t m = 0; m < M; ++m) {
        const double spread = exp(nd(rng)), centre = 3.0 * nd(rng);  // subspaces of unequal spans
        for (uint32_t c = 0; c < K; ++c) lut[size_t{m} * K + c] = static_cast<float>(centre + spread * nd(rng));
      }
      std::vector<uint8_t> q(size_t{M} * 16, 0xCD);
      const ssa::QuantizedLut ql = ssa::quantize_lut(lut.data(), M, K, q.data());
      // The rule, recomputed here in long double.
      long double span = 0, bias = 0;
      std::vector<long double> lo(M);
      for (uint32_t m = 0; m < M; ++m) {
        lo[m] = *std::min_element(lut.begin() + m * K, lut.begin() + (m + 1) * K);
        const long double hi = *std::max_element(lut.begin() + m * K, lut.begin() + (m + 1) * K);
        span = std::max(span, hi - lo[m]);
        bias += lo[m];
      }
      CHECK(ql.scale == static_cast<float>(span / 255));
      CHECK(fabs(ql.bias - static_cast<double>(bias)) <= 1e-6 * (1 + fabsl(bias)));
      bool saw_255 = false;
      for (uint32_t m = 0; m < M; ++m) {
        bool saw_0 = false;
        for (uint32_t c = 0; c < 16; ++c) {
          const uint8_t got = q[size_t{m} * 16 + c];
          if (c >= K) {
            CHECK(got == 0);
            continue;
          }
          const long double exact = (lut[size_t{m} * K + c] - lo[m]) * 255 / span;
          CHECK(fabsl(got - exact) <= 0.5L + 1e-9L);  // nearest (a half may go either way by rounding)
          saw_0 |= got == 0;
          saw_255 |= got == 255;
        }
        CHECK(saw_0);
      }
      CHECK(saw_255);
      // Scores of random codes against the float table.
      double worst = 0.0, mean_abs = 0.0;
      const int trials = 2000;
      for (int t = 0; t < trials; ++t) {
        uint32_t sum = 0;
        double exact = 0.0;
        for (uint32_t m = 0; m < M; ++m) {
          const uint32_t c = static_cast<uint32_t>(rng() % K);
          sum += q[size_t{m} * 16 + c];
          exact += lut[size_t{m} * K + c];
        }
        const double err = fabs(fmaf(ql.scale, static_cast<float>(sum), ql.bias) - exact);
        worst = std::max(worst, err);
        mean_abs += err / trials;
      }
      const double bound = M * ql.scale / 2.0, slack = 1e-6 * (fabs(ql.bias) + M * 255.0 * ql.scale);
      CHECK(worst <= bound + slack);
      // Independent rounding errors: their sum's spread is about sqrt(M / 12) steps.
      CHECK(mean_abs <= 1.5 * sqrt(M / 12.0) * ql.scale + slack);
    }
  }
  // A table with no spread: scale 0, every entry 0, every score the bias.
  std::vector<float> flat(32 * 16, 0.25f);
  std::vector<uint8_t> q(32 * 16, 7);
  const ssa::QuantizedLut ql = ssa::quantize_lut(flat.data(), 32, 16, q.data());
  CHECK(ql.scale == 0.0f);
  CHECK(ql.bias == 8.0f);
  CHECK(std::all_of(q.begin(), q.end(), [](uint8_t x) { return x == 0; }));
}

namespace {

// Keys with unequal, correlated coordinates (a fixed random mixing of decaying
// Gaussian components plus an offset), and queries drawn the same way.
struct Data {
  uint32_t d, n_kv, n;
  std::vector<float> k, v, q;
};

Data make_data(uint32_t n, uint32_t n_kv, uint32_t n_q, uint32_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  Data x{d, n_kv, n, {}, {}, {}};
  std::vector<double> mix(size_t{d} * d);
  for (double& m : mix) m = nd(rng) / sqrt(double(d));
  auto sample = [&](float* out) {
    std::vector<double> g(d);
    for (uint32_t i = 0; i < d; ++i) g[i] = nd(rng) * 3.0 * exp(-0.05 * i) + (i == 1 ? 1.5 : 0.0);
    for (uint32_t i = 0; i < d; ++i) {
      double s = 0.0;
      for (uint32_t j = 0; j < d; ++j) s += mix[size_t{i} * d + j] * g[j];
      out[i] = static_cast<float>(s);
    }
  };
  x.k.resize(size_t{n} * n_kv * d);
  x.v.resize(x.k.size());
  for (size_t i = 0; i < x.k.size(); i += d) sample(x.k.data() + i);
  for (float& f : x.v) f = static_cast<float>(nd(rng));
  x.q.resize(size_t{n_q} * d);
  for (size_t i = 0; i < x.q.size(); i += d) sample(x.q.data() + i);
  return x;
}

ssa_session_config config_4bit(const Data& x, uint32_t n_q, ssa_proxy proxy, float weight = 1.0f) {
  ssa_session_config c = make_config(1, n_q, x.n_kv, x.d, SSA_DTYPE_F32);
  c.pq_subspaces = 32;
  c.pq_centroids = 16;
  c.page_tokens = 256;
  c.index_min_tokens = x.n;
  c.index_train_sample = x.n;
  c.index_iterations = 6;
  c.proxy = proxy;
  c.pq_parallel_weight = weight;
  return c;
}

SessionPtr indexed(ssa_runtime* rt, const Data& x, uint32_t n_q, ssa_proxy proxy, float weight = 1.0f) {
  SessionPtr s = make_session(rt, config_4bit(x, n_q, proxy, weight));
  append_f32(s.get(), 0, x.k, x.v, x.n, SSA_DTYPE_F32);
  return s;
}

// The (rotated, for OPQ4) key of token t, head h, in double.
std::vector<double> coded_key(const ssa::PqCodebooks& cb, const Data& x, uint32_t h, uint32_t t) {
  const uint32_t d = x.d;
  const float* k = x.k.data() + (size_t{t} * x.n_kv + h) * d;
  std::vector<double> z(k, k + d);
  if (!cb.rotated()) return z;
  for (uint32_t i = 0; i < d; ++i) {
    z[i] = 0.0;
    for (uint32_t j = 0; j < d; ++j) z[i] += double{cb.rotation_of(h)[size_t{i} * d + j]} * k[j];
  }
  return z;
}

}  // namespace

TEST_CASE("a 4-bit session packs the nearest centroids two to a byte and scores within the table's bound") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 4, n = 1500;
  const Data x = make_data(n, n_kv, n_q, d, 51);
  for (ssa_proxy proxy : {SSA_PROXY_PQ4, SSA_PROXY_OPQ4}) {
    CAPTURE(proxy);
    SessionPtr s = indexed(rt.get(), x, n_q, proxy);
    std::shared_lock lock(s->mu);
    const ssa::KvLayout& L = s->layout;
    const ssa::LayerStore& layer = s->layers[0];
    REQUIRE(layer.codebooks != nullptr);
    const ssa::PqCodebooks& cb = *layer.codebooks;
    CHECK(cb.rotated() == (proxy == SSA_PROXY_OPQ4));
    CHECK(L.code_bits == 4);
    CHECK(L.code_page_bytes() == size_t{n_kv} * 16 * L.page_tokens);  // PQ's 16 bytes per token
    const uint32_t M = L.pq_subspaces, K = L.pq_centroids, sub = L.sub_dim();
    size_t worse = 0, checked = 0;
    for (uint32_t h = 0; h < n_kv; ++h) {
      for (uint32_t t = 0; t < n; t += 5) {
        const std::vector<double> z = coded_key(cb, x, h, t);
        const uint8_t* page = layer.code_pages[t / L.page_tokens]->data();
        for (uint32_t m = 0; m < M; ++m) {
          const uint8_t byte = page[size_t{h} * (M / 2) * L.page_tokens + (m / 2) * L.page_tokens + t % L.page_tokens];
          const uint32_t code = m % 2 == 0 ? byte & 0x0fu : byte >> 4u;
          REQUIRE(code < K);
          CHECK(code == L.code_at(page, h, m, t % L.page_tokens));
          worse += !ssa_test::is_nearest_centroid(cb, h, m, z.data(), code);
          ++checked;
        }
      }
    }
    CHECK(worse == 0);
    CHECK(checked > 10000);
    // Scores against the float64 table of the (rotated) query and the stored
    // codebooks, within the bound of the 8-bit table (M steps / 2).
    std::vector<float> lut, scores(n);
    for (uint32_t hq = 0; hq < n_q; ++hq) {
      const uint32_t h = hq / (n_q / n_kv);
      const float* q = x.q.data() + size_t{hq} * d;
      ssa::score_tokens(L, layer, h, q, SSA_METHOD_PQ_TOPK, 0, n, &lut, scores.data());
      std::vector<double> rq(q, q + d);
      if (cb.rotated()) {
        for (uint32_t i = 0; i < d; ++i) {
          rq[i] = 0.0;
          for (uint32_t j = 0; j < d; ++j) rq[i] += double{cb.rotation_of(h)[size_t{i} * d + j]} * q[j];
        }
      }
      std::vector<double> table(size_t{M} * K);
      double span = 0.0;
      for (uint32_t m = 0; m < M; ++m) {
        double lo = INFINITY, hi = -INFINITY;
        for (uint32_t c = 0; c < K; ++c) {
          double s2 = 0.0;
          for (uint32_t j = 0; j < sub; ++j) s2 += rq[m * sub + j] * cb.centroid(h, m, c)[j];
          table[size_t{m} * K + c] = s2;
          lo = std::min(lo, s2);
          hi = std::max(hi, s2);
        }
        span = std::max(span, hi - lo);
      }
      const double step = span / 255.0;
      double worst = 0.0, mean_abs = 0.0, magnitude = 0.0;
      for (uint32_t t = 0; t < n; ++t) {
        double ref = 0.0;
        for (uint32_t m = 0; m < M; ++m)
          ref += table[size_t{m} * K + L.code_at(layer.code_pages[t / L.page_tokens]->data(), h, m, t % L.page_tokens)];
        worst = std::max(worst, fabs(ref - scores[t]));
        mean_abs += fabs(ref - scores[t]) / n;
        magnitude = std::max(magnitude, fabs(ref));
      }
      CAPTURE(hq);
      CHECK(worst <= M * step / 2.0 * (1 + 1e-3) + 1e-5 * magnitude);
      CHECK(mean_abs <= 1.5 * sqrt(M / 12.0) * step + 1e-5 * magnitude);
    }
  }
}

TEST_CASE("a PQ_TOPK decode of a 4-bit session reads exactly the top k' of its 4-bit scores") {
  auto rt = make_runtime(2);
  const uint32_t d = 64, n_kv = 2, n_q = 4, n = 2000, ns = 16;
  const Data x = make_data(n, n_kv, n_q, d, 52);
  for (ssa_proxy proxy : {SSA_PROXY_PQ4, SSA_PROXY_OPQ4}) {
    CAPTURE(proxy);
    SessionPtr s = indexed(rt.get(), x, n_q, proxy);
    for (uint32_t k : {1u, 37u, 400u}) {
      CAPTURE(k);
      ssa_decode_params p = params(SSA_METHOD_PQ_TOPK, 2 * ns + k);
      p.n_sink = ns;
      p.n_local = ns;
      std::vector<float> out(x.q.size());
      std::vector<uint32_t> tokens(size_t{n_q} * (2 * ns + k));
      std::vector<uint64_t> offsets(n_q + 1);
      SSA_CHECK_OK(ssa_decode_traced(s.get(), 0, x.q.data(), out.data(), &p, nullptr, tokens.data(), nullptr,
                                     tokens.size(), offsets.data()));
      std::shared_lock lock(s->mu);
      std::vector<float> lut, scores(n - 2 * ns), qs(d);
      for (uint32_t hq = 0; hq < n_q; ++hq) {
        // The decode scores the query pre-scaled by 1/sqrt(d) (lib/decode/cpu_decode.cc).
        const float scale = 1.0f / sqrtf(static_cast<float>(d));
        for (uint32_t j = 0; j < d; ++j) qs[j] = x.q[size_t{hq} * d + j] * scale;
        ssa::score_tokens(s->layout, s->layers[0], hq / (n_q / n_kv), qs.data(), SSA_METHOD_PQ_TOPK, ns, n - ns,
                          &lut, scores.data());
        std::vector<uint32_t> order(scores.size());
        for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return scores[a] > scores[b]; });
        std::vector<uint32_t> want(order.begin(), order.begin() + k);
        for (uint32_t& t : want) t += ns;
        std::sort(want.begin(), want.end());
        std::vector<uint32_t> got;
        for (uint64_t i = offsets[hq]; i < offsets[hq + 1]; ++i)
          if (tokens[i] >= ns && tokens[i] < n - ns) got.push_back(tokens[i]);
        CAPTURE(hq);
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("4-bit configs that cannot hold their codes are refused at create, naming the rule") {
  auto rt = make_runtime(1);
  struct Bad {
    ssa_proxy proxy;
    uint32_t head_dim, subspaces, centroids;
    const char* says;
  };
  const Bad bad[] = {
      {SSA_PROXY_PQ4, 64, 32, 17, "2..16"},   {SSA_PROXY_OPQ4, 64, 32, 256, "2..16"},
      {SSA_PROXY_PQ4, 96, 3, 16, "even"},     {SSA_PROXY_PQ4, 512, 512, 16, "at most 256"},
      {SSA_PROXY_QPQ4, 64, 32, 32, "2..16"},  {(ssa_proxy)6, 64, 32, 16, "unknown proxy"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.says);
    ssa_session_config c = make_config(1, 2, 1, b.head_dim, SSA_DTYPE_F32);
    c.proxy = b.proxy;
    c.pq_subspaces = b.subspaces;
    c.pq_centroids = b.centroids;
    ssa_session* s = reinterpret_cast<ssa_session*>(0x1);
    CHECK(ssa_session_create(rt.get(), &c, &s) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(s == reinterpret_cast<ssa_session*>(0x1));  // out written only on success
    CHECK(std::string(ssa_last_error_message()).find(b.says) != std::string::npos);
  }
  // The same shapes with one-byte codes (or 4-bit with 16 centroids) are fine.
  ssa_session_config ok = make_config(1, 2, 1, 512, SSA_DTYPE_F32);
  ok.proxy = SSA_PROXY_PQ4;
  ok.pq_subspaces = 256;
  ok.pq_centroids = 16;
  SessionPtr s = make_session(rt.get(), ok);
  CHECK(s != nullptr);
}
