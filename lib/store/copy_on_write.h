// Copy-on-write of one page, for host (PagePool) and device (DevicePagePool)
// pages alike: both pools offer copy_of(const Page&) -> StatusOr<PageRef>.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/page.h"

namespace ssa {

// Makes `ref` safe to write: copies it if another session shares it (the caller's
// old and new LayerStore account for `expected_refs`) or it is read-only.
template <typename Pool>
absl::Status make_writable(Pool& pool, PageRef& ref, long expected_refs) {
  if (ref->writable() && ref.use_count() <= expected_refs) return absl::OkStatus();
  absl::StatusOr<PageRef> copy = pool.copy_of(*ref);
  if (!copy.ok()) return copy.status();
  ref = *std::move(copy);
  return absl::OkStatus();
}

}  // namespace ssa
