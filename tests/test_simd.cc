// The vectorised kernels against the portable ones (and the portable dtype
// conversions against exhaustive expectations).
#include <doctest/doctest.h>

#include <math.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/fixed_weight.h"
#include "cpu/simd.h"

TEST_CASE("f16 conversion round-trips every half value and matches F16C") {
  const ssa::simd::Kernels* avx2 = ssa::simd::avx2_kernels();
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> gen(65536), vec(65536);
  ssa::simd::generic_kernels().to_f32(ssa::DType::kF16, all.data(), gen.data(), all.size());
  if (avx2 != nullptr) avx2->to_f32(ssa::DType::kF16, all.data(), vec.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const float f = gen[i];
    if (isnan(f)) {
      CHECK(isnan(ssa::f16_to_f32(ssa::f32_to_f16(f))));
      continue;
    }
    REQUIRE(ssa::f32_to_f16(f) == all[i]);
    if (avx2 != nullptr) REQUIRE(memcmp(&vec[i], &f, 4) == 0);
  }
}

TEST_CASE("f32 -> f16 rounds to nearest even") {
  CHECK(ssa::f32_to_f16(1.0f) == 0x3c00);
  CHECK(ssa::f32_to_f16(65504.0f) == 0x7bff);
  CHECK(ssa::f32_to_f16(65520.0f) == 0x7c00);  // rounds up to infinity
  CHECK(ssa::f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3c00);  // tie -> even
  CHECK(ssa::f32_to_f16(1.0f + 3.0f / 2048.0f) == 0x3c02);  // tie -> even (up)
  CHECK(ssa::f32_to_f16(5.9604645e-08f) == 0x0001);         // smallest subnormal
  CHECK(ssa::f32_to_bf16(1.0f + 1.0f / 256.0f) == 0x3f80);  // tie -> even
}

TEST_CASE("PQ scores equal a direct sum of table entries") {
  std::mt19937 rng(9);
  const uint32_t M = 16, K = 256, P = 64;
  std::vector<float> lut(M * K);
  for (auto& x : lut) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.0f;
  std::vector<uint8_t> codes(M * P);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (size_t count : {size_t{P - 3}, size_t{1}, size_t{4}}) {
    std::vector<float> got(count);
    ssa::simd::kernels().pq_scores(lut.data(), K, M, codes.data() + 3, P, count, got.data());
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (uint32_t m = 0; m < M; ++m) want += lut[m * K + codes[m * P + 3 + i]];
      CHECK(got[i] == doctest::Approx(want).epsilon(1e-6));
    }
  }
}

TEST_CASE("AVX2 kernels agree with the portable ones") {
  const ssa::simd::Kernels* avx2 = ssa::simd::avx2_kernels();
  if (avx2 == nullptr) {
    MESSAGE("skipped: this CPU has no AVX2/FMA/F16C");
    return;
  }
  const auto& gen = ssa::simd::generic_kernels();
  std::mt19937 rng(4);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (ssa::DType t : {ssa::DType::kF32, ssa::DType::kF16, ssa::DType::kBF16}) {
    for (size_t n : {1u, 7u, 64u, 100u, 256u}) {
      std::vector<uint8_t> row(n * 4);
      std::vector<float> q(n);
      for (size_t i = 0; i < n; ++i) {
        ssa::store_from_f32(row.data(), t, i, g(rng));
        q[i] = g(rng);
      }
      CHECK(avx2->dot(t, row.data(), q.data(), n) ==
            doctest::Approx(gen.dot(t, row.data(), q.data(), n)).epsilon(1e-5));
    }
  }
  // exp: relative error against libm.
  std::vector<float> x(1000), ea(1000), eb(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -100.0f + 0.1f * static_cast<float>(i);
  std::vector<double> ba(32), bb(32);
  const double sa = avx2->exp_shifted(x.data(), 0.0f, ea.data(), x.size(), ba.data());
  const double sb = gen.exp_shifted(x.data(), 0.0f, eb.data(), x.size(), bb.data());
  for (size_t b = 0; b < 32; ++b) {
    double want = 0;
    for (size_t i = b * 32; i < std::min(x.size(), b * 32 + 32); ++i) want += eb[i];
    CHECK(bb[b] == doctest::Approx(want).epsilon(1e-12));
    CHECK(ba[b] == doctest::Approx(want).epsilon(1e-6));
  }
  CHECK(avx2->max_value(x.data(), x.size()) == x.back());
  CHECK(gen.max_value(x.data(), 999) == x[998]);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < -87.0f) continue;
    CHECK(ea[i] == doctest::Approx(eb[i]).epsilon(1e-6));
  }
  CHECK(sa == doctest::Approx(sb).epsilon(1e-6));
  // Attention block: same softmax state and accumulator as the portable fold.
  for (uint32_t d : {64u, 40u}) {
    const uint32_t heads = 3;
    const size_t n = 13;
    std::vector<float> kf(n * d), vf(n * d), q(heads * d), off(n);
    for (auto& v : kf) v = g(rng);
    for (auto& v : vf) v = g(rng);
    for (auto& v : q) v = 0.2f * g(rng);
    for (auto& v : off) v = g(rng);
    std::vector<float> ma(heads, 0.5f), la(heads, 2.0f), acc_a(heads * d, 0.1f);
    std::vector<float> mb = ma, lb = la, acc_b = acc_a;
    avx2->attend_block(kf.data(), vf.data(), n, d, q.data(), heads, off.data(), ma.data(), la.data(),
                       acc_a.data());
    ssa::simd::generic_attend_block(kf.data(), vf.data(), n, d, q.data(), heads, off.data(), mb.data(),
                                    lb.data(), acc_b.data());
    for (uint32_t h = 0; h < heads; ++h) {
      CHECK(ma[h] == doctest::Approx(mb[h]).epsilon(1e-5));
      CHECK(la[h] == doctest::Approx(lb[h]).epsilon(1e-5));
    }
    for (size_t i = 0; i < acc_a.size(); ++i) CHECK(acc_a[i] == doctest::Approx(acc_b[i]).epsilon(1e-4));
  }
  // Nearest centroid: same argmin up to ties; 256 centroids (8-bit codes) and 16
  // (4-bit codes, a path of its own) over the subspace widths in use.
  struct Shape {
    uint32_t K, dim;
  };
  for (const Shape sh : {Shape{256, 16}, Shape{16, 2}, Shape{16, 4}, Shape{16, 8}, Shape{16, 16}}) {
    const uint32_t K = sh.K, dim = sh.dim;
    std::vector<float> cent_t(dim * K), norms(K), xq(dim);
    for (auto& v : cent_t) v = g(rng);
    for (uint32_t c = 0; c < K; ++c) {
      norms[c] = 0;
      for (uint32_t j = 0; j < dim; ++j) norms[c] += cent_t[j * K + c] * cent_t[j * K + c];
    }
    auto dist = [&](uint32_t c) {
      double s = 0;
      for (uint32_t j = 0; j < dim; ++j) s += (double{xq[j]} - cent_t[j * K + c]) * (double{xq[j]} - cent_t[j * K + c]);
      return s;
    };
    int same = 0;
    for (int trial = 0; trial < 200; ++trial) {
      for (auto& v : xq) v = g(rng);
      const uint32_t ia = avx2->nearest_centroid(xq.data(), cent_t.data(), norms.data(), K, dim);
      const uint32_t ib = gen.nearest_centroid(xq.data(), cent_t.data(), norms.data(), K, dim);
      INFO("K=", K, " dim=", dim);
      REQUIRE(ia < K);
      same += ia == ib;
      if (ia != ib) CHECK(dist(ia) == doctest::Approx(dist(ib)).epsilon(1e-5));
      // Against a float64 search: no centroid is nearer beyond rounding.
      double best = dist(0);
      for (uint32_t c = 1; c < K; ++c) best = std::min(best, dist(c));
      CHECK(dist(ia) <= best + 1e-5 * (1 + best));
    }
    CHECK(same >= 190);  // ties of random floats are rare: the two searches agree
  }
}

TEST_CASE("attend_rows of every kernel set equals a float64 softmax over the rows it folds") {
  std::vector<const ssa::simd::Kernels*> sets = {&ssa::simd::generic_kernels()};
  if (ssa::simd::avx2_kernels() != nullptr) sets.push_back(ssa::simd::avx2_kernels());
  if (ssa::simd::avx512_kernels() != nullptr) sets.push_back(ssa::simd::avx512_kernels());
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (const ssa::simd::Kernels* k : sets) {
    CAPTURE(k->name);
    for (ssa::DType t : {ssa::DType::kF32, ssa::DType::kF16, ssa::DType::kBF16}) {
      // 48 and 40 are not multiples of the AVX-512 width (40 not of the AVX2 one).
      for (uint32_t d : {8u, 40u, 48u, 64u, 128u, 256u}) {
        for (uint32_t heads : {1u, 2u, 3u, 4u, 5u, 8u}) {
          CAPTURE(static_cast<int>(t));
          CAPTURE(d);
          CAPTURE(heads);
          // A pool of rows in the store's dtype; blocks gather them out of order.
          const size_t pool = 80, eb = ssa::dtype_bytes(t);
          std::vector<uint8_t> K(pool * d * eb), V(pool * d * eb);
          for (size_t i = 0; i < pool * d; ++i) {
            ssa::store_from_f32(K.data(), t, i, g(rng));
            ssa::store_from_f32(V.data(), t, i, g(rng));
          }
          std::vector<float> q(size_t{heads} * d);
          for (auto& v : q) v = 0.3f * g(rng);
          std::vector<float> m(heads, -INFINITY), l(heads, 0.0f), acc(size_t{heads} * d, 0.0f);
          std::vector<double> ref_l(heads, 0.0), ref_acc(size_t{heads} * d, 0.0);
          for (size_t n : {size_t{32}, size_t{1}, size_t{7}, size_t{31}, size_t{16}}) {
            std::vector<const void*> kr(n), vr(n);
            std::vector<size_t> idx(n);
            std::vector<float> off(n);
            for (size_t r = 0; r < n; ++r) {
              idx[r] = rng() % pool;
              kr[r] = K.data() + idx[r] * d * eb;
              vr[r] = V.data() + idx[r] * d * eb;
              off[r] = 2.0f * g(rng);
            }
            k->attend_rows(t, kr.data(), vr.data(), n, d, q.data(), heads, off.data(), m.data(), l.data(),
                           acc.data());
            // float64 reference, unnormalised with a fixed shift of 0 (logits are small).
            for (uint32_t h = 0; h < heads; ++h) {
              for (size_t r = 0; r < n; ++r) {
                double s = 0.0;
                for (uint32_t j = 0; j < d; ++j) {
                  s += double(q[size_t{h} * d + j]) * ssa::load_as_f32(K.data(), t, idx[r] * d + j);
                }
                const double w = exp(s - off[r]);
                ref_l[h] += w;
                for (uint32_t j = 0; j < d; ++j) {
                  ref_acc[size_t{h} * d + j] += w * ssa::load_as_f32(V.data(), t, idx[r] * d + j);
                }
              }
            }
          }
          for (uint32_t h = 0; h < heads; ++h) {
            // The state's total weight l * e^m and output acc / l against the reference.
            CHECK(double(l[h]) * exp(double(m[h])) == doctest::Approx(ref_l[h]).epsilon(1e-5));
            double err = 0.0, norm = 0.0;
            for (uint32_t j = 0; j < d; ++j) {
              const double want = ref_acc[size_t{h} * d + j] / ref_l[h];
              const double got = double(acc[size_t{h} * d + j]) / l[h];
              err = std::max(err, fabs(got - want));
              norm = std::max(norm, fabs(want));
            }
            CHECK(err <= 1e-5 * std::max(norm, 1.0));
          }
        }
      }
    }
  }
}

TEST_CASE("block_max and proposal_blocks of every kernel set equal their scalar definitions") {
  std::vector<const ssa::simd::Kernels*> sets{&ssa::simd::generic_kernels()};
  if (ssa::simd::avx2_kernels() != nullptr) sets.push_back(ssa::simd::avx2_kernels());
  std::mt19937 rng(17);
  std::normal_distribution<float> g(0.0f, 4.0f);
  for (const ssa::simd::Kernels* k : sets) {
    for (size_t blocks : {1u, 3u, 40u}) {
      const size_t n = blocks * 32;
      std::vector<float> x(n);
      for (auto& v : x) v = g(rng);
      x[n / 2] = -150.0f;  // a weight that underflows (exp below -87 is 0)
      std::vector<float> bm(blocks), sample(blocks);
      const float all = k->block_max(x.data(), blocks, bm.data(), sample.data());
      CHECK(all == *std::max_element(x.begin(), x.end()));
      for (size_t b = 0; b < blocks; ++b) {
        CHECK(bm[b] == *std::max_element(x.begin() + b * 32, x.begin() + b * 32 + 32));
        CHECK(sample[b] == x[b * 32 + ssa::simd::sample_lane(b)]);
      }
      // The weights are exp_shifted's bits, their block sums fixed_weight's.
      const float shift = all, threshold = 2.5f;
      std::vector<float> w(n), want_w(n);
      k->exp_shifted(x.data(), shift, want_w.data(), n, nullptr);
      for (size_t cap : {size_t{0}, size_t{3}, n}) {
        std::vector<uint64_t> sums(blocks, 7);
        std::vector<uint32_t> cand(n, 0);
        const size_t above = k->proposal_blocks(x.data(), blocks, shift, threshold, w.data(), sums.data(),
                                                cand.data(), cap, 1000);
        std::vector<uint32_t> want_cand;
        for (size_t i = 0; i < n; ++i) {
          if (x[i] >= threshold) want_cand.push_back(static_cast<uint32_t>(1000 + i));
        }
        CHECK(above == want_cand.size());
        const size_t stored = std::min(cap, above);
        CHECK(std::equal(cand.begin(), cand.begin() + stored, want_cand.begin()));
        CHECK(memcmp(w.data(), want_w.data(), n * sizeof(float)) == 0);
        for (size_t b = 0; b < blocks; ++b) {
          uint64_t want = 0;
          for (size_t i = b * 32; i < b * 32 + 32; ++i) want += ssa::fixed_weight(want_w[i]);
          CHECK(sums[b] == want);
        }
      }
      // Without weights: only the indices, nothing written to w or the sums.
      std::vector<uint32_t> cand(n);
      CHECK(k->proposal_blocks(x.data(), blocks, shift, INFINITY, nullptr, nullptr, cand.data(), n, 0) == 0);
    }
  }
}
