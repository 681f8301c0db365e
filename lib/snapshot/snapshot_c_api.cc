// C entry points of the snapshot subsystem beyond save/checkpoint/load (which
// live in lib/c_api.cc). Same boundary: every call runs inside c_api_guarded,
// which catches everything, maps absl::Status to ssa_status and sets the
// thread-local message.
#include <memory>

#include "absl/functional/function_ref.h"
#include "session.h"
#include "snapshot/snapshot.h"
#include "ssa.h"
#include "status.h"

namespace ssa {
ssa_status c_api_guarded(absl::FunctionRef<absl::Status()> fn);  // lib/c_api.cc
}  // namespace ssa

extern "C" {

ssa_status ssa_session_load_checked(ssa_runtime* rt, const char* path, uint32_t flags,
                                    const ssa_session_config* expected, ssa_session** out) {
  return ssa::c_api_guarded([&]() -> absl::Status {
    if (out == nullptr) return ssa::invalid_argument("out is NULL");
    absl::StatusOr<std::unique_ptr<ssa_session>> s =
        ssa::snapshot_load_checked(rt, path, flags, expected);
    if (!s.ok()) return s.status();
    *out = s->release();
    return absl::OkStatus();
  });
}

void ssa_snapshot_info_init(ssa_snapshot_info* info) {
  if (info == nullptr) return;
  *info = ssa_snapshot_info{};
  info->struct_size = sizeof(ssa_snapshot_info);
}

ssa_status ssa_snapshot_inspect(const char* path, ssa_snapshot_info* info) {
  return ssa::c_api_guarded([&]() { return ssa::snapshot_inspect(path, info); });
}

ssa_status ssa_session_set_metadata(ssa_session* s, const void* bytes, size_t n) {
  return ssa::c_api_guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_set_metadata(*s, bytes, n);
  });
}

ssa_status ssa_session_get_metadata(const ssa_session* s, void* buf, size_t cap, size_t* n_out) {
  return ssa::c_api_guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_get_metadata(*s, buf, cap, n_out);
  });
}

}  // extern "C"
