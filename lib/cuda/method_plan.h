// Maps a decode request (method, budget, sink/local, seed) onto the knobs of a
// CUDA launch set, with the CPU backend's planner (decode/decode_plan.h) and heavy
// set rule (select/selection.h), so both backends read the same tokens.
#pragma once

#include "decode/decode_plan.h"
#include "kernels/decode_types.h"
#include "ssa.h"

namespace ssa::cuda {

// Proxy, heavy rule and sampling of `method` (for a launch set of non-dense items).
void set_method(ssa_method method, DecodeBatch* b);

// Fills the plan fields of one item (token ranges, k', |H|) from the CPU planner.
void plan_item(const DecodePlan& plan, const ssa_decode_params& p, DecodeItem* item);

}  // namespace ssa::cuda
