// The entry point behind ssa_decode_traced: ssa_decode plus the rows each query
// head read, written into caller-owned buffers (include/ssa.h states the contract).
#pragma once

#include <stdint.h>

#include "absl/status/status.h"
#include "decode.h"

namespace ssa {

struct TraceBuffers {
  uint32_t* tokens = nullptr;        // capacity entries
  float* log_pi = nullptr;           // capacity entries, or null (not wanted)
  uint64_t capacity = 0;
  uint64_t* head_offsets = nullptr;  // n_q_heads + 1 entries
};

absl::Status decode_traced(ssa_session& s, uint32_t layer, const void* q, void* out,
                           const ssa_decode_params& p, ssa_decode_stats* stats, const TraceBuffers& buf);

}  // namespace ssa
