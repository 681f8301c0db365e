// What a loaded session must satisfy whatever file it came from: every layer
// decodes with every method it supports, and (unless its K/V pages are mapped
// unchecked) every output is finite. Under ASan this is also where an
// out-of-range value a load let through would read out of bounds.
#pragma once

#include <math.h>

#include <string>

#include "support/snapshot_helpers.h"

namespace ssa::test {

// Empty when the session passes; else what failed.
inline std::string check_loaded_session(ssa_session& s, bool expect_finite, uint64_t seed = 3) {
  const KvLayout& L = s.layout;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint32_t l = 0; l < L.n_layers; ++l) {
    std::vector<uint8_t> q(size_t{L.n_q_heads} * L.head_dim * L.elem_bytes());
    for (size_t i = 0; i < size_t{L.n_q_heads} * L.head_dim; ++i) store_from_f32(q.data(), L.dtype, i, nd(rng));
    bool indexed;
    uint64_t n;
    {
      std::shared_lock lock(s.mu);
      indexed = s.layers[l].codebooks != nullptr;
      n = s.layers[l].n_tokens;
    }
    if (n == 0) continue;  // nothing to attend to (decode says so)
    for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK}) {
      if (!indexed && m != SSA_METHOD_DENSE) continue;  // would train (change) the session
      ssa_decode_params p{};
      p.struct_size = sizeof p;
      p.method = m;
      p.sparsity = 4.0f;
      p.heavy_fraction = 0.4f;
      p.n_sink = 4;
      p.n_local = 4;
      p.pi_min = 1e-4f;
      p.seed = 1234;
      p.step = 7;
      std::vector<uint8_t> out(q.size());
      const absl::Status st = decode(s, l, q.data(), out.data(), p, nullptr);
      if (!st.ok()) {
        return "layer " + std::to_string(l) + " method " + std::to_string(m) + ": " +
               std::string(st.message());
      }
      if (!expect_finite) continue;
      for (size_t i = 0; i < size_t{L.n_q_heads} * L.head_dim; ++i) {
        if (!std::isfinite(load_as_f32(out.data(), L.dtype, i))) {
          return "layer " + std::to_string(l) + " method " + std::to_string(m) +
                 ": non-finite output " + std::to_string(i);
        }
      }
    }
  }
  return "";
}

}  // namespace ssa::test
