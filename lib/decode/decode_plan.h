// The shape of one decode: how many tokens are always read (sink, local), the
// candidate range C between them, the budget k' left for C, and whether the
// request degenerates to exact dense attention (method DENSE, k >= N, k' >= |C|).
#pragma once

#include <stdint.h>

#include "absl/status/status.h"
#include "ssa.h"

namespace ssa {

struct DecodePlan {
  uint64_t n = 0;            // context tokens N
  uint64_t sink_end = 0;     // sink tokens are [0, sink_end)
  uint64_t local_begin = 0;  // local tokens are [local_begin, n)
  uint64_t kprime = 0;       // budget for the candidates [sink_end, local_begin)
  bool dense = true;

  uint64_t candidates() const { return local_begin - sink_end; }
};

absl::Status validate_decode_params(const ssa_decode_params& p);
DecodePlan plan_decode(uint64_t n, const ssa_decode_params& p);

// True for methods that score candidates with the PQ proxy (need an index).
bool method_uses_pq(ssa_method m);

}  // namespace ssa
