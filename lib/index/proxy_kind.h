// What each ssa_proxy asks of the index: a learned transform before quantising
// (a rotation, or one learned from the queries), and codes of 8 or 4 bits
// (docs/ALGORITHM.md, section 4).
#pragma once

#include <stdint.h>

#include "ssa.h"

namespace ssa {

inline bool proxy_is_known(uint32_t p) { return p <= SSA_PROXY_QPQ4; }
// A learned orthogonal rotation (OPQ).
inline bool proxy_has_rotation(ssa_proxy p) { return p == SSA_PROXY_OPQ || p == SSA_PROXY_OPQ4; }
// A key transform learned from observed queries, with its query side (QPQ).
inline bool proxy_is_query_aware(ssa_proxy p) { return p == SSA_PROXY_QPQ || p == SSA_PROXY_QPQ4; }
// Codebooks that carry a key transform (and a query transform for QPQ).
inline bool proxy_has_transform(ssa_proxy p) { return proxy_has_rotation(p) || proxy_is_query_aware(p); }
inline bool proxy_has_4bit_codes(ssa_proxy p) {
  return p == SSA_PROXY_PQ4 || p == SSA_PROXY_OPQ4 || p == SSA_PROXY_QPQ4;
}

// 4-bit proxies sum one 8-bit table entry per subspace in 16-bit lanes: 256
// subspaces x 255 < 2^16.
inline constexpr uint32_t kMax4BitSubspaces = 256;

}  // namespace ssa
