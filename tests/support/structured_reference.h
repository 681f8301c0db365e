// Exact (float64) attention of each query head of a structured context over the
// K/V a session of dtype t holds (the context's values rounded to t).
#pragma once

#include <vector>

#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

namespace ssa_test {

inline std::vector<std::vector<double>> exact_outputs(const StructuredContext& ctx, ssa_dtype t) {
  const auto Kq = quantised(ctx.K, t), Vq = quantised(ctx.V, t), qq = quantised(ctx.q, t);
  const size_t group = ctx.n_q / ctx.n_kv;
  std::vector<std::vector<double>> ref(ctx.n_q);
  for (size_t h = 0; h < ctx.n_q; ++h) {
    const auto Kh = head_rows(Kq, ctx.n, ctx.n_kv, ctx.d, h / group);
    const auto Vh = head_rows(Vq, ctx.n, ctx.n_kv, ctx.d, h / group);
    ref[h] = dense_attention_f64(&qq[h * ctx.d], Kh.data(), Vh.data(), ctx.n, ctx.d);
  }
  return ref;
}

}  // namespace ssa_test
