// A runtime's group over the caller's NCCL communicator (communicator_group.h).
#include <memory>

#include "nccl_collective.h"
#include "shard/communicator_group.h"
#include "status.h"

namespace ssa {

absl::StatusOr<std::shared_ptr<ProcessGroup>> communicator_group(void* comm, int32_t device) {
  absl::StatusOr<std::unique_ptr<NcclCollective>> t = NcclCollective::create_with_stream(comm, kCommunicatorTimeoutMs);
  if (!t.ok()) return t.status();
  if ((*t)->device() != device) {
    return invalid_argument("ssa_runtime_options.communicator is a communicator of CUDA device ", (*t)->device(),
                            " but the runtime's device is ", device,
                            ": set ssa_runtime_options.device to the communicator's device");
  }
  return ProcessGroup::over(*std::move(t), kCommunicatorTimeoutMs, "NCCL");
}

}  // namespace ssa
