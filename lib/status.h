// Errors inside the core are absl::Status values; each carries the public
// ssa_status it maps to, so the ABI boundary reports exactly the intended code.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ssa.h"

namespace ssa {

absl::Status make_error(ssa_status code, std::string message);
ssa_status status_code(const absl::Status& st);

template <typename... Args>
absl::Status invalid_argument(const Args&... args) {
  return make_error(SSA_ERR_INVALID_ARGUMENT, absl::StrCat(args...));
}
template <typename... Args>
absl::Status internal_error(const Args&... args) {
  return make_error(SSA_ERR_INTERNAL, absl::StrCat(args...));
}
template <typename... Args>
absl::Status unsupported(const Args&... args) {
  return make_error(SSA_ERR_UNSUPPORTED, absl::StrCat(args...));
}

}  // namespace ssa

#define SSA_RETURN_IF_ERROR(expr)            \
  do {                                       \
    absl::Status ssa_status_tmp_ = (expr);   \
    if (!ssa_status_tmp_.ok()) return ssa_status_tmp_; \
  } while (0)
