// The sharding options of ssa_runtime_options, checked and resolved at
// ssa_runtime_create: the device list (one entry per shard, in shard order) and
// the tokens a shard takes before the next one starts.
#pragma once

#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ssa.h"

namespace ssa {

// The most shards (devices) one runtime spans.
inline constexpr uint32_t kMaxShards = 64;
// shard_tokens 0 means this many.
inline constexpr uint64_t kDefaultShardTokens = uint64_t{1} << 20;

inline constexpr const char* kCommunicatorUnsupported =
    "ssa_runtime_options.communicator: this build of libssa has no NCCL (CUDA builds that find NCCL's header "
    "and library take an ncclComm_t); pass NULL, and make the runtime a rank of the group through a "
    "`collective` table of callbacks instead";
inline constexpr const char* kShardedBudgetUnsupported =
    "device_kv_budget with a CUDA runtime over several devices (n_devices > 1): tiered sharded sessions "
    "are not implemented in this version; shard over more devices instead, or use one device with a budget";

// *out = the shards' devices: the list (n_devices 1..kMaxShards, no duplicates,
// no negative ordinals), or {o.device} when there is none.
absl::Status read_shard_devices(const ssa_runtime_options& o, std::vector<int32_t>* out);

// Test seam: lets a device list repeat an ordinal (several shards on one
// device), so that the sharded CUDA path runs on a machine with one GPU. The
// library never sets it; a user's repeated ordinal is an error.
void allow_repeated_shard_devices(bool allow);

// 0 -> kDefaultShardTokens; else a positive multiple of kSplitTokens.
absl::StatusOr<uint64_t> resolve_shard_tokens(uint64_t shard_tokens);

}  // namespace ssa
