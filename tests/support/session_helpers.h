// Test helpers over the public C API: sessions from float arrays in any dtype,
// decodes returning float outputs, and the quantised copy of K/V that the
// float64 references must use (the session stores K/V in its dtype).
#pragma once

#include <stdint.h>

#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "ssa.h"

namespace ssa_test {

#define SSA_CHECK_OK(expr)                                                              \
  do {                                                                                  \
    const ssa_status st_ = (expr);                                                      \
    if (st_ != SSA_OK)                                                                  \
      throw std::runtime_error(std::string(#expr) + ": " + ssa_status_string(st_) + ": " + \
                               ssa_last_error_message());                               \
  } while (0)

struct RuntimeDeleter {
  void operator()(ssa_runtime* r) const { ssa_runtime_destroy(r); }
};
struct SessionDeleter {
  void operator()(ssa_session* s) const { ssa_session_destroy(s); }
};
using RuntimePtr = std::unique_ptr<ssa_runtime, RuntimeDeleter>;
using SessionPtr = std::unique_ptr<ssa_session, SessionDeleter>;

inline RuntimePtr make_runtime(int threads = 2, uint64_t seed = 1234) {
  ssa_runtime_options o;
  ssa_runtime_options_init(&o);
  o.backend = SSA_BACKEND_CPU;
  o.num_threads = threads;
  o.seed = seed;
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  return RuntimePtr(rt);
}

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

inline ssa_session_config make_config(uint32_t n_layers, uint32_t n_q, uint32_t n_kv, uint32_t d,
                                      ssa_dtype t) {
  ssa_session_config c;
  ssa_session_config_init(&c);
  c.n_layers = n_layers;
  c.n_q_heads = n_q;
  c.n_kv_heads = n_kv;
  c.head_dim = d;
  c.kv_dtype = t;
  return c;
}

inline SessionPtr make_session(ssa_runtime* rt, const ssa_session_config& c) {
  ssa_session* s = nullptr;
  SSA_CHECK_OK(ssa_session_create(rt, &c, &s));
  return SessionPtr(s);
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

inline ssa_decode_params params(ssa_method m, uint32_t budget = 0, float sparsity = 50.0f) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = m;
  p.budget = budget;
  p.sparsity = sparsity;
  return p;
}

constexpr ssa_method kAllMethods[] = {SSA_METHOD_DENSE,          SSA_METHOD_ORACLE_TOPK,
                                      SSA_METHOD_PQ_TOPK,        SSA_METHOD_HYBRID_UNIFORM,
                                      SSA_METHOD_SAMPLING,       SSA_METHOD_SSA,
                                      SSA_METHOD_SSA_ADAPTIVE};

}  // namespace ssa_test
