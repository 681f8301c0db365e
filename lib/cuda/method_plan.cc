#include "method_plan.h"

#include "select/selection.h"

namespace ssa::cuda {

void set_method(ssa_method method, DecodeBatch* b) {
  b->heavy = HeavyRule::kFixed;
  switch (method) {
    case SSA_METHOD_DENSE: b->proxy = Proxy::kNone; b->sampling = Sampling::kNone; break;
    case SSA_METHOD_ORACLE_TOPK: b->proxy = Proxy::kExact; b->sampling = Sampling::kNone; break;
    case SSA_METHOD_PQ_TOPK: b->proxy = Proxy::kPq; b->sampling = Sampling::kNone; break;
    case SSA_METHOD_HYBRID_UNIFORM: b->proxy = Proxy::kPq; b->sampling = Sampling::kUniform; break;
    case SSA_METHOD_SAMPLING:
    case SSA_METHOD_SSA: b->proxy = Proxy::kPq; b->sampling = Sampling::kProxy; break;
    case SSA_METHOD_SSA_ADAPTIVE:
      b->proxy = Proxy::kPq;
      b->sampling = Sampling::kProxy;
      b->heavy = HeavyRule::kAdaptive;
      break;
    default: b->proxy = Proxy::kNone; b->sampling = Sampling::kNone; break;
  }
}

void plan_item(const DecodePlan& plan, const ssa_decode_params& p, DecodeItem* item) {
  item->n_tokens = static_cast<uint32_t>(plan.n);
  if (plan.dense || plan.kprime == 0) {
    // k' = 0 reads sink and local only: a dense item over those would be wrong,
    // so keep the ranges and select nothing.
    item->sink_end = static_cast<uint32_t>(plan.dense ? plan.n : plan.sink_end);
    item->local_begin = static_cast<uint32_t>(plan.dense ? plan.n : plan.local_begin);
    item->n_select = 0;
    item->n_heavy = 0;
    return;
  }
  item->sink_end = static_cast<uint32_t>(plan.sink_end);
  item->local_begin = static_cast<uint32_t>(plan.local_begin);
  item->n_select = static_cast<uint32_t>(plan.kprime);
  item->n_heavy = p.method == SSA_METHOD_SSA_ADAPTIVE
                      ? 0
                      : static_cast<uint32_t>(fixed_heavy_count(p.method, plan.kprime, p.heavy_fraction));
}

}  // namespace ssa::cuda
