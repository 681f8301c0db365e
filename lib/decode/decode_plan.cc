#include "decode_plan.h"

#include <math.h>

#include <algorithm>

#include "status.h"

namespace ssa {

absl::Status validate_decode_params(const ssa_decode_params& p) {
  if (p.struct_size < sizeof(ssa_decode_params)) {
    return invalid_argument("decode params struct_size ", p.struct_size, " < ",
                            sizeof(ssa_decode_params), " (call ssa_decode_params_init)");
  }
  if (static_cast<uint32_t>(p.method) > SSA_METHOD_SSA_ADAPTIVE) {
    return invalid_argument("unknown decode method ", static_cast<int>(p.method));
  }
  if (p.budget == 0 && !(p.sparsity >= 1.0f && std::isfinite(p.sparsity))) {
    return invalid_argument("sparsity ", p.sparsity, " must be a finite number >= 1 when budget is 0");
  }
  if (!(p.heavy_fraction >= 0.0f && p.heavy_fraction <= 1.0f)) {
    return invalid_argument("heavy_fraction ", p.heavy_fraction, " must be in [0, 1]");
  }
  if (!(p.pi_min > 0.0f && p.pi_min <= 1.0f)) {
    return invalid_argument("pi_min ", p.pi_min, " must be in (0, 1]");
  }
  return absl::OkStatus();
}

bool method_uses_pq(ssa_method m) {
  return m == SSA_METHOD_PQ_TOPK || m == SSA_METHOD_HYBRID_UNIFORM || m == SSA_METHOD_SAMPLING ||
         m == SSA_METHOD_SSA || m == SSA_METHOD_SSA_ADAPTIVE;
}

DecodePlan plan_decode(uint64_t n, const ssa_decode_params& p) {
  DecodePlan plan;
  plan.n = n;
  plan.sink_end = std::min<uint64_t>(p.n_sink, n);
  plan.local_begin = std::max<uint64_t>(plan.sink_end, n - std::min<uint64_t>(p.n_local, n));
  const uint64_t k = p.budget != 0
                         ? p.budget
                         : static_cast<uint64_t>(ceil(static_cast<double>(n) / p.sparsity));
  const uint64_t always = plan.sink_end + (n - plan.local_begin);
  plan.kprime = k > always ? k - always : 0;
  plan.dense = p.method == SSA_METHOD_DENSE || k >= n || plan.kprime >= plan.candidates();
  return plan;
}

}  // namespace ssa
