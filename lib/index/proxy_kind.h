// What each ssa_proxy asks of the index: a learned rotation before quantising,
// and codes of 8 or 4 bits (docs/ALGORITHM.md, section 4).
#pragma once

#include <stdint.h>

#include "ssa.h"

namespace ssa {

inline bool proxy_is_known(uint32_t p) { return p <= SSA_PROXY_OPQ4; }
inline bool proxy_has_rotation(ssa_proxy p) { return p == SSA_PROXY_OPQ || p == SSA_PROXY_OPQ4; }
inline bool proxy_has_4bit_codes(ssa_proxy p) { return p == SSA_PROXY_PQ4 || p == SSA_PROXY_OPQ4; }

// 4-bit proxies sum one 8-bit table entry per subspace in 16-bit lanes: 256
// subspaces x 255 < 2^16.
inline constexpr uint32_t kMax4BitSubspaces = 256;

}  // namespace ssa
