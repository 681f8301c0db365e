// The proposal of a selection made once per KV group (ssa_group_selection):
// the logits whose softmax the group's heavy set and draws come from. The
// derivation is docs/GROUP_SELECTION.md; the selection itself is select_tokens,
// run once per KV head on these logits with the group's budget.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace ssa {

// out[t] = log sum_j softmax(scores[j])[t] over the g heads of a group: the
// logits of the mixture (1/g) sum_j softmax_j, up to the constant log g that
// the softmax ignores. scores[j] points at n candidate scores of head j; head j's
// softmax over all of its candidates has the maximum head_max[j] and the
// normaliser head_total[j] (the fixed-point sum of exp(s - head_max[j]),
// proposal_total): given those, each out[t] depends on the g scores of token t
// alone, so the shards of a sharded session compute their own tokens' logits
// from the all-reduced maxima and totals. A group of one head uses its scores as
// they are (its mixture is its own softmax), so g = 1 selects bitwise as a
// per-head selection does.
void mixture_logits(const float* const* scores, uint32_t g, size_t n, const float* head_max,
                    const uint64_t* head_total, float* out);

// The fixed-point sum of exp(s[i] - mx) over n scores (the proposal's normaliser).
uint64_t proposal_total(const float* s, size_t n, float mx);

// out[d] = mean of the g queries q[g][d] (queries already scaled by 1/sqrt(d)).
void mean_query(const float* q, uint32_t g, uint32_t d, float* out);

}  // namespace ssa
