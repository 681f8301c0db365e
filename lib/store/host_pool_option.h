// ssa_runtime_options.host_pool_bytes: the rule every backend checks (a valid
// option does not depend on the machine), and the chunk the CUDA backend pins
// it in (lib/cuda/pinned_chunks.h).
#pragma once

#include <stdint.h>

#include "absl/status/status.h"
#include "ssa.h"
#include "status.h"

namespace ssa {

inline constexpr uint64_t kHostPoolChunkBytes = uint64_t{64} << 20;

inline absl::Status check_host_pool_option(const ssa_runtime_options& o) {
  if (o.host_pool_bytes == 0) return absl::OkStatus();
  if (o.host_pool_bytes % kHostPoolChunkBytes != 0) {
    return invalid_argument("host_pool_bytes ", o.host_pool_bytes, " must be a multiple of ", kHostPoolChunkBytes,
                            " (64 MiB, the chunk it is page-locked in)");
  }
  if (o.device_kv_budget == 0) {
    return invalid_argument("host_pool_bytes ", o.host_pool_bytes,
                            " needs a device_kv_budget (pages live in host memory only beyond the budget)");
  }
  return absl::OkStatus();
}

}  // namespace ssa
