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

void set_group(const ssa_decode_params& p, uint32_t group_size, DecodeBatch* b) {
  switch (p.group_selection) {
    case SSA_GROUP_MEAN_QUERY: b->group = GroupProposal::kMeanQuery; break;
    case SSA_GROUP_MIXTURE:
      b->group = group_size > 1 ? GroupProposal::kMixture : GroupProposal::kMeanQuery;
      break;
    default: b->group = GroupProposal::kOff; break;
  }
}

uint64_t selection_budget(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size) {
  return p.group_selection != SSA_GROUP_OFF ? plan.kprime * group_size : plan.kprime;
}

bool group_reads_all(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size) {
  return p.group_selection != SSA_GROUP_OFF && !plan.dense &&
         selection_budget(plan, p, group_size) >= plan.candidates();
}

void plan_item(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size, DecodeItem* item) {
  item->n_tokens = static_cast<uint32_t>(plan.n);
  const bool dense = plan.dense || group_reads_all(plan, p, group_size);
  if (dense || plan.kprime == 0) {
    // k' = 0 reads sink and local only: a dense item over those would be wrong,
    // so keep the ranges and select nothing.
    item->sink_end = static_cast<uint32_t>(dense ? plan.n : plan.sink_end);
    item->local_begin = static_cast<uint32_t>(dense ? plan.n : plan.local_begin);
    item->n_select = 0;
    item->n_heavy = 0;
    return;
  }
  const uint64_t k = selection_budget(plan, p, group_size);  // < candidates: not dense
  item->sink_end = static_cast<uint32_t>(plan.sink_end);
  item->local_begin = static_cast<uint32_t>(plan.local_begin);
  item->n_select = static_cast<uint32_t>(k);
  item->n_heavy = p.method == SSA_METHOD_SSA_ADAPTIVE
                      ? 0
                      : static_cast<uint32_t>(fixed_heavy_count(p.method, k, p.heavy_fraction));
}

}  // namespace ssa::cuda
