#include "decode_plan.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "status.h"
#include "versioned_struct.h"

namespace ssa {

absl::Status read_decode_params(const ssa_decode_params* in, ssa_decode_params* out) {
  ssa_decode_params_init(out);
  if (in == nullptr) return absl::OkStatus();
  return read_struct(in, out);
}

absl::Status validate_decode_params(const ssa_decode_params& p) {
  if (p.struct_size != sizeof(ssa_decode_params)) {
    return internal_error("decode params not read with read_decode_params (struct_size ", p.struct_size, ")");
  }
  if (enum_value(p.method) > SSA_METHOD_SSA_ADAPTIVE) {
    return invalid_argument("unknown decode method ", enum_value(p.method), " (SSA_METHOD_DENSE .. SSA_METHOD_SSA_ADAPTIVE)");
  }
  // An error-targeted decode chooses its own budgets: sparsity is not read then.
  if (p.budget == 0 && !(p.target_error > 0.0f) && !(p.sparsity >= 1.0f && std::isfinite(p.sparsity))) {
    return invalid_argument("sparsity ", p.sparsity, " must be a finite number >= 1 when budget is 0");
  }
  if (!(p.heavy_fraction >= 0.0f && p.heavy_fraction <= 1.0f)) {
    return invalid_argument("heavy_fraction ", p.heavy_fraction, " must be in [0, 1]");
  }
  if (!(p.pi_min > 0.0f && p.pi_min <= 1.0f)) {
    return invalid_argument("pi_min ", p.pi_min, " must be in (0, 1]");
  }
  if (!(p.target_error >= 0.0f && std::isfinite(p.target_error))) {
    return invalid_argument("target_error ", p.target_error, " must be a finite number >= 0 (0 = off)");
  }
  if (p.group_selection > SSA_GROUP_MEAN_QUERY) {
    return invalid_argument("unknown group_selection ", p.group_selection,
                            " (SSA_GROUP_OFF, SSA_GROUP_MIXTURE or SSA_GROUP_MEAN_QUERY)");
  }
  if (p.target_error > 0.0f) {
    if (p.method != SSA_METHOD_SSA && p.method != SSA_METHOD_SSA_ADAPTIVE) {
      return invalid_argument("target_error > 0 needs method SSA or SSA_ADAPTIVE (method ",
                              static_cast<int>(p.method), " has no sampled tail to measure its error)");
    }
    if (!(p.target_delta > 0.0f && p.target_delta < 1.0f)) {
      return invalid_argument("target_delta ", p.target_delta, " must be in (0, 1)");
    }
    if (p.method == SSA_METHOD_SSA && p.heavy_fraction >= 1.0f) {
      return invalid_argument("target_error > 0 with SSA needs heavy_fraction < 1 (with 1 nothing is "
                              "sampled, so the error cannot be estimated)");
    }
    if (p.max_budget != 0 && p.budget > p.max_budget) {
      return invalid_argument("budget ", p.budget, " (the floor with target_error > 0) exceeds max_budget ",
                              p.max_budget);
    }
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
  const uint64_t always = plan.fixed_tokens();
  if (p.target_error > 0.0f && p.method != SSA_METHOD_DENSE) {
    // The floor is `budget` (0: none); the cap max_budget (0: N/5, at least the floor).
    const uint64_t floor = p.budget;
    const uint64_t cap =
        p.max_budget != 0
            ? p.max_budget
            : std::max<uint64_t>(floor, static_cast<uint64_t>(ceil(static_cast<double>(n) * kDefaultTargetCapFraction)));
    plan.targeted = true;
    plan.kprime = floor > always ? floor - always : 0;
    plan.kprime_cap = cap > always ? cap - always : 0;
    plan.dense = floor >= n || plan.kprime >= plan.candidates();
    return plan;
  }
  const uint64_t k = p.budget != 0
                         ? p.budget
                         : static_cast<uint64_t>(ceil(static_cast<double>(n) / p.sparsity));
  plan.kprime = k > always ? k - always : 0;
  plan.dense = p.method == SSA_METHOD_DENSE || k >= n || plan.kprime >= plan.candidates();
  return plan;
}

}  // namespace ssa
