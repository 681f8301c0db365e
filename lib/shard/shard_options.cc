#include "shard_options.h"

#include <algorithm>
#include <atomic>

#include "decode/fixed_splits.h"
#include "status.h"

namespace ssa {
namespace {
std::atomic<bool> repeats_allowed{false};
}  // namespace

void allow_repeated_shard_devices(bool allow) { repeats_allowed.store(allow); }

absl::Status read_shard_devices(const ssa_runtime_options& o, std::vector<int32_t>* out) {
  if (o.devices == nullptr) {
    if (o.n_devices != 0) {
      return invalid_argument("n_devices ", o.n_devices, " with devices NULL (set both, or neither)");
    }
    *out = {o.device};
    return absl::OkStatus();
  }
  if (o.n_devices == 0 || o.n_devices > kMaxShards) {
    return invalid_argument("n_devices ", o.n_devices, " must be in 1..", kMaxShards, " when devices is set");
  }
  std::vector<int32_t> list(o.devices, o.devices + o.n_devices);
  for (uint32_t i = 0; i < o.n_devices; ++i) {
    if (list[i] < 0) return invalid_argument("devices[", i, "] = ", list[i], " is negative");
    for (uint32_t j = 0; j < i; ++j) {
      if (list[j] == list[i] && !repeats_allowed.load()) {
        return invalid_argument("devices[", i, "] = ", list[i], " repeats devices[", j,
                                "] (one shard per device)");
      }
    }
  }
  *out = std::move(list);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> resolve_shard_tokens(uint64_t shard_tokens) {
  if (shard_tokens == 0) return kDefaultShardTokens;
  if (shard_tokens % kSplitTokens != 0) {
    return invalid_argument("shard_tokens ", shard_tokens, " must be a multiple of ", kSplitTokens,
                            " (shard boundaries fall on the decode's fixed splits)");
  }
  return shard_tokens;
}

}  // namespace ssa
