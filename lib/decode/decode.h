// Decode entry points behind the C API: argument checks, the session lock (with
// on-demand PQ training when a proxy method meets a layer without an index),
// then the backend's pipeline.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "cpu_decode.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

absl::Status decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                    const ssa_decode_params& p, ssa_decode_stats* stats,
                    std::vector<HeadTrace>* traces = nullptr, DecodeProfile* profile = nullptr);

// No item's out may overlap any q or another item's out (qs may share memory).
absl::Status check_batch_buffers(const ssa_decode_item* items, size_t n_items);

absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                          const ssa_decode_params& p);

}  // namespace ssa
