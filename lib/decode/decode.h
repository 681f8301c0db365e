// Decode entry points behind the C API: argument checks, the session lock (with
// on-demand PQ training when a proxy method meets a layer without an index),
// then the backend's pipeline.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "caller_buffers.h"
#include "cpu_decode.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

// ssa_decode. Every check that can refuse the call runs before anything lazy
// (on-demand index training). With `trained` (ssa_decode_traced, which can
// still refuse once the decode is done), an index the layer lacks is trained
// into *trained, a copy of the layer, and not installed: the caller installs it
// (session_install_index) once it has succeeded.
absl::Status decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                    const ssa_decode_params& p, ssa_decode_stats* stats,
                    std::vector<HeadTrace>* traces = nullptr, DecodeProfile* profile = nullptr,
                    LayerStore* trained = nullptr);

// What the session's runtime and backend cannot serve for a decode of `layer`
// (SSA_ERR_UNSUPPORTED, or a backend's refusal), before anything lazy is done.
absl::Status check_decode_request(const ssa_session& s, uint32_t layer, const ssa_decode_params& p);

// q and out of a decode of session s, as buffers of the aliasing rule.
CallerBuffer q_buffer(const ssa_session& s, const void* q, size_t item = SIZE_MAX);
CallerBuffer out_buffer(const ssa_session& s, const void* out, size_t item = SIZE_MAX);

absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                          const ssa_decode_params& p);

}  // namespace ssa
