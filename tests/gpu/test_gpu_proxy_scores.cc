// The proxies' scoring kernels against the CPU backend's own scoring code run
// here on the host: a query transform inside the lookup-table kernel (the
// CPU's rotate_query, then its table), and 4-bit codes scored from byte tables
// (the CPU's quantize_lut, its integer sums and fmaf), for GQA groups 1, 4 and
// 8 (one, two and eight heads per scoring pass) and 32 or 64 subspaces.
#include <doctest/doctest.h>
#include <math.h>

#include <random>
#include <vector>

#include "decode/decode_plan.h"
#include "decode/quantized_lut.h"
#include "index/pq_index.h"
#include "lib/cuda/method_plan.h"
#include "store/pq_codebooks.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

struct ScoreRun {
  cuda::DecodeBatch b;
  Decoder dec;
  DevBuf<uint8_t> out;
  DecodePlan plan;
};

// PQ top-k over `t` (budget 400, sink 100, local 60), with the query transform
// `xf` (device [n_kv][d][d], null: none).
void run_scores(ScoreRun& r, const TestLayer& t, const float* xf) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = SSA_METHOD_PQ_TOPK;
  p.budget = 400;
  p.n_sink = 100;
  p.n_local = 60;
  p.seed = 99;
  r.plan = plan_decode(t.n, p);
  REQUIRE(!r.plan.dense);
  r.b = cuda::DecodeBatch{};
  r.b.shape = shape_of(t.L);
  r.b.n_items = 1;
  cuda::set_method(p.method, &r.b);
  r.b.seed = p.seed;
  const size_t out_bytes = size_t{t.L.n_q_heads} * t.L.row_bytes();
  r.out = DevBuf<uint8_t>(out_bytes);
  r.b.items[0] = item_of(t, r.out.p);
  r.b.items[0].query_transform = xf;
  cuda::plan_item(r.plan, p, t.L.group_size(), &r.b.items[0]);
  CUDA_OK(r.dec.run(&r.b));
  CUDA_OK(cudaDeviceSynchronize());
}

std::vector<float> row_scores(const ScoreRun& r, uint32_t h) {
  const cuda::DecodeItem& it = r.b.items[0];
  std::vector<float> v(it.n_tokens);
  CUDA_OK(cudaMemcpy(v.data(), r.dec.ws.scores + it.score_base + size_t{h} * it.n_pad, it.n_tokens * sizeof(float),
                     cudaMemcpyDeviceToHost));
  return v;
}

// Codebooks on the host carrying a key transform and a different query
// transform (random, not orthogonal: the kernel must use the query's matrix as
// given), for rotate_query.
PqCodebooks transformed_books(const TestLayer& t, uint64_t seed) {
  PqCodebooks cb;
  cb.n_kv_heads = t.L.n_kv_heads;
  cb.subspaces = t.L.pq_subspaces;
  cb.centroids = t.L.pq_centroids;
  cb.sub_dim = t.L.sub_dim();
  cb.data = t.books;
  const size_t dd = size_t{t.L.head_dim} * t.L.head_dim;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  cb.rotation.resize(cb.n_kv_heads * dd);
  cb.query_transform.resize(cb.n_kv_heads * dd);
  const float s = 1.0f / sqrtf(static_cast<float>(t.L.head_dim));
  for (float& x : cb.rotation) x = nd(rng) * s;
  for (float& x : cb.query_transform) x = nd(rng) * s;
  return cb;
}

// Head h's scores of every candidate as the CPU backend computes them
// (lib/decode/candidate_scores.cc): the scaled query, transformed by
// rotate_query when `cb` carries a transform, its float table, then for 4-bit
// codes the quantised table's fmaf(scale, integer sum, bias); for 8-bit codes
// the float64 sum of the float table's entries.
std::vector<double> cpu_scores(const TestLayer& t, const PqCodebooks* cb, uint32_t h) {
  const uint32_t d = t.L.head_dim, M = t.L.pq_subspaces, K = t.L.pq_centroids, sub = d / M;
  const uint32_t kvh = h / t.L.group_size();
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  std::vector<float> q(d), scratch(d);
  for (uint32_t j = 0; j < d; ++j) q[j] = t.q[size_t{h} * d + j] * scale;
  const float* qt = cb != nullptr ? rotate_query(*cb, kvh, q.data(), scratch.data()) : q.data();
  std::vector<float> lut(size_t{M} * K);
  for (uint32_t m = 0; m < M; ++m)
    for (uint32_t c = 0; c < K; ++c) {
      const float* cen = t.books.data() + ((size_t{kvh} * M + m) * K + c) * sub;
      float s = 0.0f;
      for (uint32_t j = 0; j < sub; ++j) s += qt[m * sub + j] * cen[j];
      lut[size_t{m} * K + c] = s;
    }
  std::vector<uint8_t> lut8(size_t{M} * 16);
  const QuantizedLut ql = t.L.code_bits == 4 ? quantize_lut(lut.data(), M, K, lut8.data()) : QuantizedLut{};
  std::vector<double> out(t.n);
  for (uint32_t i = 0; i < t.n; ++i) {
    const uint8_t* code = t.codes.data() + (size_t{i} * t.L.n_kv_heads + kvh) * M;
    if (t.L.code_bits == 4) {
      uint32_t sum = 0;
      for (uint32_t m = 0; m < M; ++m) sum += lut8[size_t{m} * 16 + code[m]];
      out[i] = fmaf(ql.scale, static_cast<float>(sum), ql.bias);
    } else {
      double s = 0.0;
      for (uint32_t m = 0; m < M; ++m) s += lut[size_t{m} * K + code[m]];
      out[i] = s;
    }
  }
  return out;
}

// Candidates whose GPU score differs from the CPU's: exactly (4-bit, the same
// float tables and integer sums), or by more than float rounding (8-bit, sums
// in another order). Masked tokens must be -inf.
uint32_t mismatches(const TestLayer& t, const ScoreRun& r, const PqCodebooks* cb) {
  uint32_t bad = 0;
  for (uint32_t h = 0; h < t.L.n_q_heads; ++h) {
    const std::vector<float> got = row_scores(r, h);
    const std::vector<double> ref = cpu_scores(t, cb, h);
    for (uint32_t i = 0; i < t.n; ++i) {
      const bool cand = i >= r.plan.sink_end && i < r.plan.local_begin;
      if (!cand) {
        bad += got[i] != -INFINITY;
      } else if (t.L.code_bits == 4) {
        bad += got[i] != static_cast<float>(ref[i]);
      } else {
        bad += fabs(got[i] - ref[i]) > 1e-4 * (1 + fabs(ref[i]));
      }
    }
  }
  return bad;
}

// Subspaces 16 to 64 take the byte-pair tables (16: a padded row stride), 128
// the nibble lookups (pair tables too large for shared memory), and with 8
// heads a pass 64 too.
TEST_CASE("gpu 4-bit proxy scores equal the CPU's quantised-table scores bit for bit") {
  SSA_GPU_TEST_OR_SKIP();
  for (uint32_t G : {1u, 4u, 8u}) {
    for (uint32_t M : {16u, 32u, 64u, 128u}) {
      TestLayer t;
      build_layer(t, 2 * G, 2, 128, DType::kF16, 7000, 128, M, 16, 5 + G + M, 3.0f, 0, 4);
      ScoreRun r;
      run_scores(r, t, nullptr);
      INFO("G=", G, " M=", M);
      CHECK(mismatches(t, r, nullptr) == 0);
    }
  }
}

TEST_CASE("gpu query transforms: the lookup tables are the CPU's, for 8-bit and 4-bit codes") {
  SSA_GPU_TEST_OR_SKIP();
  struct Shape {
    uint32_t M, K, bits;
  };
  for (const Shape sh : {Shape{16, 256, 8}, Shape{32, 16, 4}}) {
    for (uint32_t G : {1u, 4u, 8u}) {
      TestLayer t;
      build_layer(t, 2 * G, 2, 128, DType::kBF16, 5000, 64, sh.M, sh.K, 17 + G, 3.0f, 0, sh.bits);
      const PqCodebooks cb = transformed_books(t, 23 + G);
      DevBuf<float> xf(cb.query_transform.size());
      xf.upload(cb.query_transform);
      ScoreRun r;
      run_scores(r, t, xf.p);
      INFO("G=", G, " bits=", sh.bits);
      CHECK(mismatches(t, r, &cb) == 0);
      // Not the untransformed scores: the transform was applied.
      ScoreRun plain;
      run_scores(plain, t, nullptr);
      CHECK(row_scores(plain, 0) != row_scores(r, 0));
    }
  }
}

}  // namespace
}  // namespace ssa::gputest
