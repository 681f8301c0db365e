// Session configs, decode parameters and runtime options for tests, benchmarks and
// the fuzzer. Each starts from the library's *_init function, so every field the
// caller does not name keeps its default, including fields a later version adds.
#pragma once

#include <stdint.h>

#include "ssa.h"

namespace ssa_test {

// A session of this shape; page size, PQ and index policy at their defaults.
inline ssa_session_config make_config(uint32_t n_layers, uint32_t n_q, uint32_t n_kv, uint32_t d,
                                      ssa_dtype t = SSA_DTYPE_F16) {
  ssa_session_config c;
  ssa_session_config_init(&c);
  c.n_layers = n_layers;
  c.n_q_heads = n_q;
  c.n_kv_heads = n_kv;
  c.head_dim = d;
  c.kv_dtype = t;
  return c;
}

// Decode parameters at their defaults but for the method and its budget (budget 0:
// ceil(N / sparsity) tokens per query head).
inline ssa_decode_params params(ssa_method m, uint32_t budget = 0, float sparsity = 50.0f) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = m;
  p.budget = budget;
  p.sparsity = sparsity;
  return p;
}

// threads 0: one worker per hardware thread (the library's rule).
inline ssa_runtime_options runtime_options(ssa_backend b, int32_t threads = 0) {
  ssa_runtime_options o;
  ssa_runtime_options_init(&o);
  o.backend = b;
  o.num_threads = threads;
  return o;
}

}  // namespace ssa_test
