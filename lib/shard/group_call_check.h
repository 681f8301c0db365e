// Before a decode of a group of processes exchanges anything, its ranks check
// that they are making the same call: the same layer at the same length, the
// same index, the same q and parameters. A rank that appended other rows or
// passed another q would otherwise take part in a selection that is nobody's
// (every rank's output wrong, silently); this way each gets an error instead.
#pragma once

#include <stdint.h>

#include "absl/status/status.h"
#include "callback_collective.h"
#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

// One all-gather of a 64-byte summary of the call.
absl::Status check_same_call(ProcessGroup& g, const KvLayout& layout, const LayerStore& layer,
                             uint32_t layer_index, const void* q, const ssa_decode_params& p, uint64_t seed);

}  // namespace ssa
