// Decode steps (ssa_decode_step): one token's K/V appended and the layer
// decoded over the grown context in one call. With a reservation
// (ssa_session_reserve, CUDA sessions) the step runs on the device from lengths
// kept there, so a CUDA graph can capture it once and replay it for every
// token; the host learns the grown lengths when it settles the session (the
// first other call on it, or ssa_session_sync). Without one the step is an
// append then a decode, on every backend.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "absl/status/status.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

absl::Status session_reserve(ssa_session& s, uint64_t n_tokens);
absl::Status session_sync(ssa_session& s, uint64_t* dropped_steps);
absl::Status session_prefetch(ssa_session& s, uint64_t n_tokens);
absl::Status decode_step(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                         const ssa_decode_params& p, ssa_decode_stats* stats);

// Commits what queued steps appended (and, with `end`, ends the reservation)
// before a call that reads or changes the session's layers; a no-op for a
// session without a reservation. session_settle takes the session exclusively;
// session_settle_locked is for a caller that holds it so.
absl::Status session_settle(ssa_session& s, bool end);
absl::Status session_settle_locked(ssa_session& s, bool end);

}  // namespace ssa
