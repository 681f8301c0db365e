// Maps a decode request (method, budget, sink/local, seed, group selection) onto
// the knobs of a CUDA launch set, with the CPU backend's planner
// (decode/decode_plan.h) and heavy set rule (select/selection.h), so both
// backends read the same tokens.
#pragma once

#include "decode/decode_plan.h"
#include "kernels/decode_types.h"
#include "ssa.h"

namespace ssa::cuda {

// Proxy, heavy rule and sampling of `method` (for a launch set of non-dense items).
void set_method(ssa_method method, DecodeBatch* b);

// The selection rows of p.group_selection (for a launch set of non-dense items).
// The mixture of a group of one head is that head's own softmax: its logits are
// its scores (as the CPU's mixture_logits copies them), which the mean query
// of one head gives bit for bit.
void set_group(const ssa_decode_params& p, uint32_t group_size, DecodeBatch* b);

// Middle rows one selection row takes: k', or the group's g k' with group
// selection (docs/GROUP_SELECTION.md, "What the budget means").
uint64_t selection_budget(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size);

// With group selection, a group's budget g k' may cover every candidate where
// one head's k' does not: the CPU then reads all of them exactly, so the item
// is decoded densely (its output is the dense one).
bool group_reads_all(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size);

// Fills the plan fields of one item (token ranges, selection budget, |H|) from
// the CPU planner; group_size: q heads per KV head of the session.
void plan_item(const DecodePlan& plan, const ssa_decode_params& p, uint32_t group_size, DecodeItem* item);

}  // namespace ssa::cuda
