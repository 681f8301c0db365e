// How many pipeline rounds an error-targeted CUDA decode ran (targeted_decode.cc),
// for benchmarks: the public stats do not carry it. No other includes, so a
// benchmark compiled on its own can ask.
#pragma once

#include <stdint.h>

namespace ssa::cuda {

// Rounds of the calling thread's last error-targeted CUDA decode (0 before any;
// 1 for one that needed no estimate: exact, or only sink and local rows).
uint32_t last_targeted_rounds();

}  // namespace ssa::cuda
