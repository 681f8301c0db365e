// Helpers of the GPU tests that go through the public C API: f16 test data with
// needle keys, CPU/CUDA runtimes and sessions, appends from host or device
// memory, and decodes with host or device q/out.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <math.h>

#include <random>
#include <vector>

#include "common/dtype.h"
#include "config.h"
#include "gpu_layer.h"
#include "ssa.h"

namespace ssa::gputest {

constexpr uint32_t kNq = 8, kNkv = 2, kD = 128;

struct Data {
  uint32_t n;
  std::vector<uint16_t> k, v, q;  // f16 bits
};

// Gaussian K/V; one token in 64 a needle towards the first q head of each KV
// group (k += needle_gain * q). q_scale: the queries' scale (1: norm ~sqrt(d)).
inline Data make_data(uint32_t n, uint64_t seed, float q_scale = 1.0f, float needle_gain = 2.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Data d;
  d.n = n;
  d.q.resize(kNq * kD);
  for (auto& x : d.q) x = f32_to_f16(q_scale * nd(rng));
  d.k.resize(size_t{n} * kNkv * kD);
  d.v.resize(d.k.size());
  for (uint32_t i = 0; i < n; ++i) {
    const bool needle = (rng() % 64) == 0;
    for (uint32_t h = 0; h < kNkv; ++h)
      for (uint32_t j = 0; j < kD; ++j) {
        float x = nd(rng);
        if (needle) x += needle_gain * f16_to_f32(d.q[h * (kNq / kNkv) * kD + j]);
        d.k[(size_t{i} * kNkv + h) * kD + j] = f32_to_f16(x);
        d.v[(size_t{i} * kNkv + h) * kD + j] = f32_to_f16(nd(rng));
      }
  }
  return d;
}

inline ssa_runtime* runtime(ssa_backend b) {
  const ssa_runtime_options o = ssa_test::runtime_options(b);
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

// regrow: index_regrow_factor (4, the default; 0: trained once, never again).
inline ssa_session* session(ssa_runtime* rt, uint32_t flags, ssa_dtype dtype = SSA_DTYPE_F16, float regrow = 4.0f) {
  ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, dtype);
  c.page_tokens = 128;
  c.flags = flags;
  c.index_min_tokens = 1024;
  c.index_regrow_factor = regrow;
  ssa_session* s = nullptr;
  REQUIRE(ssa_session_create(rt, &c, &s) == SSA_OK);
  return s;
}

// Appends in two parts (the second lands in a partially filled page).
inline void fill(ssa_session* s, const Data& d, bool device) {
  const uint32_t cut = d.n / 3 + 5;
  const size_t row = size_t{kNkv} * kD;
  if (!device) {
    REQUIRE(ssa_session_append(s, 0, d.k.data(), d.v.data(), cut) == SSA_OK);
    REQUIRE(ssa_session_append(s, 0, d.k.data() + cut * row, d.v.data() + cut * row, d.n - cut) == SSA_OK);
    return;
  }
  DevBuf<uint16_t> k(d.k.size()), v(d.v.size());
  k.upload(d.k);
  v.upload(d.v);
  REQUIRE(ssa_session_append(s, 0, k.p, v.p, cut) == SSA_OK);
  REQUIRE(ssa_session_append(s, 0, k.p + cut * row, v.p + cut * row, d.n - cut) == SSA_OK);
}

// rel_l2 of two f16 outputs (b the reference).
inline double rel(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  std::vector<float> x(a.size()), y(b.size());
  for (size_t i = 0; i < a.size(); ++i) x[i] = f16_to_f32(a[i]);
  for (size_t i = 0; i < b.size(); ++i) y[i] = f16_to_f32(b[i]);
  return ssa_test::rel_l2(x.data(), y.data(), y.size());
}

inline ssa_decode_params params(ssa_method m, uint32_t budget, uint64_t step = 0) {
  ssa_decode_params p = ssa_test::params(m, budget);
  p.step = step;
  return p;
}

// Decode with host q/out for a host-pointer session, device buffers otherwise.
inline std::vector<uint16_t> decode(ssa_session* s, const Data& d, const ssa_decode_params& p, bool device,
                             ssa_decode_stats* stats = nullptr) {
  std::vector<uint16_t> out(kNq * kD, 0xffff);
  if (!device) {
    REQUIRE(ssa_decode(s, 0, d.q.data(), out.data(), &p, stats) == SSA_OK);
    return out;
  }
  DevBuf<uint16_t> q(d.q.size()), o(out.size());
  q.upload(d.q);
  o.upload(out);
  const ssa_status st = ssa_decode(s, 0, q.p, o.p, &p, stats);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return o.download(out.size());
}

}  // namespace ssa::gputest
