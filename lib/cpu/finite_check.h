// NaN/Inf policy: libssa rejects non-finite K, V and q with
// SSA_ERR_INVALID_ARGUMENT (one NaN key would otherwise poison every later
// decode of the session). The check looks at exponent bits only, so it is a
// cheap pass next to PQ encoding.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa {

// Index of the first NaN or infinity among n values of dtype t, or n if none.
size_t first_non_finite(DType t, const void* data, size_t n);

}  // namespace ssa
