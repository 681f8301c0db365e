#include "status.h"

#include "absl/strings/cord.h"

namespace ssa {
namespace {
constexpr char kPayloadUrl[] = "ssa.status";

absl::StatusCode canonical_code(ssa_status code) {
  switch (code) {
    case SSA_ERR_INVALID_ARGUMENT: return absl::StatusCode::kInvalidArgument;
    case SSA_ERR_OUT_OF_MEMORY: return absl::StatusCode::kResourceExhausted;
    case SSA_ERR_IO: return absl::StatusCode::kUnavailable;
    case SSA_ERR_CORRUPT: return absl::StatusCode::kDataLoss;
    case SSA_ERR_VERSION: return absl::StatusCode::kOutOfRange;
    case SSA_ERR_MISMATCH: return absl::StatusCode::kFailedPrecondition;
    case SSA_ERR_UNSUPPORTED: return absl::StatusCode::kUnimplemented;
    case SSA_ERR_DEVICE: return absl::StatusCode::kAborted;
    case SSA_ERR_BUSY: return absl::StatusCode::kAlreadyExists;
    default: return absl::StatusCode::kInternal;
  }
}
}  // namespace

absl::Status make_error(ssa_status code, std::string message) {
  absl::Status st(canonical_code(code), std::move(message));
  st.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return st;
}

ssa_status status_code(const absl::Status& st) {
  if (st.ok()) return SSA_OK;
  if (auto payload = st.GetPayload(kPayloadUrl)) {
    return static_cast<ssa_status>(std::stoi(std::string(*payload)));
  }
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument: return SSA_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted: return SSA_ERR_OUT_OF_MEMORY;
    default: return SSA_ERR_INTERNAL;
  }
}

}  // namespace ssa
