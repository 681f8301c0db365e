#include "backend.h"

#include "session.h"
#include "status.h"

namespace ssa {

const Backend* backend_of(ssa_backend kind) {
  switch (kind) {
    case SSA_BACKEND_CPU: return &cpu_backend();
    case SSA_BACKEND_CUDA: return cuda_backend();
    default: return nullptr;
  }
}

absl::StatusOr<ssa_backend> choose_backend(ssa_backend wanted, int device) {
  const Backend* cuda = cuda_backend();
  if (wanted == SSA_BACKEND_CUDA) {
    if (cuda == nullptr) return unsupported("the CUDA backend is not available in this build");
    SSA_RETURN_IF_ERROR(cuda->check_device(device));
    return SSA_BACKEND_CUDA;
  }
  if (wanted == SSA_BACKEND_AUTO && cuda != nullptr && cuda->check_device(device).ok()) return SSA_BACKEND_CUDA;
  return SSA_BACKEND_CPU;
}

bool host_buffers(const ssa_session& s) {
  return !s.backend->device_buffers() || (s.config.flags & SSA_SESSION_HOST_POINTERS) != 0;
}

}  // namespace ssa
