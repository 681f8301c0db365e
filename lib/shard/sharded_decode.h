// The CPU decode of a sharded session (docs/SHARDING.md): one rank per shard,
// each reading only its own tokens (lib/shard/shard_map.h), exchanging through
// the collectives of lib/shard/collective.h what the selection needs globally:
// the proposal's maximum and normaliser, the top-k threshold (all-reduced
// radix histograms), the residual mass of every shard (the draws of the one
// RNG stream are split by it), the adaptive rule's top k' candidates, and the
// attention partials of every split, merged in split order. The result is
// bitwise the unsharded decode's (lib/decode/cpu_decode.cc), for DENSE and every
// method and group_selection mode; error-targeted decodes are not sharded.
#pragma once

#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "decode/cpu_decode.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

inline constexpr const char* kShardedTargetUnsupported =
    "error-targeted decode (target_error > 0) of a sharded session is not implemented: its budget search "
    "reads rows one at a time across the whole context; use a fixed budget, or an unsharded runtime";

inline constexpr const char* kGroupTracesUnsupported =
    "per-head traces of a decode over a group of processes are not recorded (each rank sees only its own "
    "shard's selection); trace on one process (a group's snapshot loads into one)";

// Whether sessions of the runtime are sharded (more than one shard).
// A runtime that is one rank of a group of processes always is (even a group
// of one: its decodes are the group's collective calls).
inline bool runtime_sharded(const ssa_runtime& rt) { return rt.devices.size() > 1 || rt.group != nullptr; }

// As cpu_decode_layer, for a session of a sharded runtime; traces list the
// rows of every shard in layer indices (the unsharded decode's rows). On a
// runtime of a group of processes (docs/DISTRIBUTED.md) it is a collective
// call: this process runs its rank's shard, and every rank gets the whole
// output and the same stats (traces are not recorded there: UNSUPPORTED).
// The first exchange of a decode of a group (lib/shard/group_call_check.h),
// made on its own before the decode trains a layer's index on demand (itself a
// collective call), so that ranks not making the same decode find out before
// any of them trains. Takes the group's call mutex.
absl::Status check_group_decode(const ssa_session& s, const LayerStore& layer, uint32_t layer_index, const void* q,
                                const ssa_decode_params& p, uint64_t seed);

absl::Status sharded_decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                                  const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                                  ssa_decode_stats* stats, std::vector<HeadTrace>* traces);

}  // namespace ssa
