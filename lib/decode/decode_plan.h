// The shape of one decode: how many tokens are always read (sink, local), the
// candidate range C between them, the budget k' left for C, and whether the
// request degenerates to exact dense attention (method DENSE, k >= N, k' >= |C|).
// An error-targeted decode (target_error > 0) has a range of budgets instead:
// from the floor (kprime, from `budget`) to the cap (kprime_cap, from max_budget);
// each head picks its own within it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "absl/status/status.h"
#include "ssa.h"

namespace ssa {

struct DecodePlan {
  uint64_t n = 0;            // context tokens N
  uint64_t sink_end = 0;     // sink tokens are [0, sink_end)
  uint64_t local_begin = 0;  // local tokens are [local_begin, n)
  uint64_t kprime = 0;       // budget for the candidates [sink_end, local_begin)
  uint64_t kprime_cap = 0;   // error-targeted: the largest budget for them
  bool targeted = false;     // error-targeted decode
  bool dense = true;

  uint64_t candidates() const { return local_begin - sink_end; }
  uint64_t fixed_tokens() const { return sink_end + (n - local_begin); }
  // Whether any candidate may be read (then proxy methods need an index).
  bool selects() const { return !dense && (targeted ? kprime_cap : kprime) > 0; }
  // The budget (or cap) covers only sink and local tokens of a longer context.
  bool window_only() const { return !dense && (targeted ? kprime_cap : kprime) == 0; }
};

// The smallest struct_size accepted (the end of the core fields; the rule is
// lib/versioned_struct.h's).
constexpr size_t kDecodeParamsMinSize = offsetof(ssa_decode_params, target_error);
constexpr size_t kDecodeStatsMinSize = offsetof(ssa_decode_stats, residual_proxy_mass);

// Default cap of an error-targeted budget: N / 5 (a fifth of the rows; beyond
// that a sparse decode saves little over a dense one).
constexpr double kDefaultTargetCapFraction = 0.2;

constexpr const char* kGroupNoErrorTarget =
    "group_selection with target_error > 0 (an error target per KV group) is not implemented; "
    "use one of them";

// *out = defaults overlaid with the first in->struct_size bytes of *in (an
// older, shorter struct keeps the defaults of the fields it lacks).
absl::Status read_decode_params(const ssa_decode_params* in, ssa_decode_params* out);

absl::Status validate_decode_params(const ssa_decode_params& p);
DecodePlan plan_decode(uint64_t n, const ssa_decode_params& p);

// True for methods that score candidates with the PQ proxy (need an index).
bool method_uses_pq(ssa_method m);

// True when decoding with this plan and method needs the layer's PQ index
// (trained on demand when missing).
inline bool plan_needs_index(const DecodePlan& plan, ssa_method m) {
  return plan.selects() && method_uses_pq(m);
}

}  // namespace ssa
