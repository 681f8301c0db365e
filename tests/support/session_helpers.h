// Test helpers over the public C API: K/V from float arrays in any dtype,
// decodes returning float outputs, and the quantised copy of K/V that the
// float64 references must use (the session stores K/V in its dtype).
#pragma once

#include <stdint.h>

#include <random>
#include <vector>

#include "common/dtype.h"
#include "config.h"
#include "handles.h"
#include "ssa.h"

namespace ssa_test {

// n normal(0, scale) floats from a fixed seed.
inline std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Bytes of `v` converted to dtype t.
inline std::vector<uint8_t> encode(const std::vector<float>& v, ssa_dtype t) {
  const ssa::DType dt = static_cast<ssa::DType>(t);
  std::vector<uint8_t> out(v.size() * ssa::dtype_bytes(dt));
  for (size_t i = 0; i < v.size(); ++i) ssa::store_from_f32(out.data(), dt, i, v[i]);
  return out;
}

inline std::vector<float> decode_bytes(const std::vector<uint8_t>& b, ssa_dtype t, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = ssa::load_as_f32(b.data(), static_cast<ssa::DType>(t), i);
  return out;
}

// The values as the session stores them (rounded to dtype), in double.
inline std::vector<double> quantised(const std::vector<float>& v, ssa_dtype t) {
  const std::vector<uint8_t> b = encode(v, t);
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ssa::load_as_f32(b.data(), static_cast<ssa::DType>(t), i);
  return out;
}

// One KV head's rows [n][d] out of token-major [n][n_kv][d].
inline std::vector<double> head_rows(const std::vector<double>& kv, size_t n, size_t n_kv, size_t d,
                                     size_t head) {
  std::vector<double> out(n * d);
  for (size_t t = 0; t < n; ++t)
    for (size_t j = 0; j < d; ++j) out[t * d + j] = kv[(t * n_kv + head) * d + j];
  return out;
}

// Appends float K/V ([n][n_kv][d]) to a layer, converted to the session's dtype.
inline void append_f32(ssa_session* s, uint32_t layer, const std::vector<float>& K,
                       const std::vector<float>& V, uint64_t n, ssa_dtype t) {
  const std::vector<uint8_t> kb = encode(K, t), vb = encode(V, t);
  SSA_CHECK_OK(ssa_session_append(s, layer, kb.data(), vb.data(), n));
}

inline std::vector<float> run_decode(ssa_session* s, uint32_t layer, const std::vector<float>& q,
                                     ssa_dtype t, const ssa_decode_params& p,
                                     ssa_decode_stats* stats = nullptr) {
  const std::vector<uint8_t> qb = encode(q, t);
  std::vector<uint8_t> ob(qb.size());
  SSA_CHECK_OK(ssa_decode(s, layer, qb.data(), ob.data(), &p, stats));
  return decode_bytes(ob, t, q.size());
}

constexpr ssa_method kAllMethods[] = {SSA_METHOD_DENSE,          SSA_METHOD_ORACLE_TOPK,
                                      SSA_METHOD_PQ_TOPK,        SSA_METHOD_HYBRID_UNIFORM,
                                      SSA_METHOD_SAMPLING,       SSA_METHOD_SSA,
                                      SSA_METHOD_SSA_ADAPTIVE};

}  // namespace ssa_test
