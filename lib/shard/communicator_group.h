// A group over the caller's NCCL communicator (ssa_runtime_options.communicator):
// rank and size are the communicator's (ncclCommUserRank, ncclCommCount), the
// transport is lib/shard/nccl's NcclCollective on a stream of the runtime's
// own, with kCommunicatorTimeoutMs on every collective. Built where NCCL is
// found (SSA_HAVE_NCCL); elsewhere every communicator is refused.
#pragma once

#include <stdint.h>

#include <memory>

#include "absl/status/statusor.h"
#include "callback_collective.h"
#include "shard_options.h"
#include "status.h"

namespace ssa {

// The timeout of every collective over a communicator: a call that does not
// complete within it (or whose communicator reports an asynchronous error)
// aborts the communicator (ncclCommAbort) and returns SSA_ERR_IO.
inline constexpr uint32_t kCommunicatorTimeoutMs = 60000;

#if defined(SSA_HAVE_NCCL) && SSA_HAVE_NCCL
inline constexpr bool kHaveCommunicators = true;
// comm: an ncclComm_t whose device must be `device` (the runtime's).
absl::StatusOr<std::shared_ptr<ProcessGroup>> communicator_group(void* comm, int32_t device);
#else
inline constexpr bool kHaveCommunicators = false;
inline absl::StatusOr<std::shared_ptr<ProcessGroup>> communicator_group(void*, int32_t) {
  return unsupported(kCommunicatorUnsupported);
}
#endif

}  // namespace ssa
