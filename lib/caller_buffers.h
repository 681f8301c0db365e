// The aliasing rule of every call that takes several caller buffers (ssa.h,
// Conventions): a buffer the call writes may not overlap any other buffer of the
// call; buffers it only reads may share memory. One check, before anything is
// read or written through them.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"

namespace ssa {

struct CallerBuffer {
  const void* p = nullptr;  // null or empty buffers take part in nothing
  size_t bytes = 0;
  const char* name = "";    // as in ssa.h: "q", "out", "head_offsets"
  bool written = false;
  size_t item = SIZE_MAX;   // the batch item it belongs to; SIZE_MAX: none
};

// OK, or SSA_ERR_INVALID_ARGUMENT naming an overlapping pair (a written buffer
// and another one). O(n log n) in the number of buffers.
absl::Status check_no_overlap(std::vector<CallerBuffer> buffers);

}  // namespace ssa
