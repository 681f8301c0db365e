// Checks of page and codebook contents read from a snapshot, against the rules
// the session's own writers keep: K/V and centroids are finite (append rejects
// NaN/Inf), and every PQ code names a centroid (< pq_centroids; each nibble of
// a 4-bit proxy's code byte), because a decode indexes its lookup table with the
// codes unchecked.
#pragma once

#include <stdint.h>

#include <string>

#include "absl/status/status.h"
#include "store/kv_layout.h"
#include "store/pq_codebooks.h"

namespace ssa::snap {

// SSA_ERR_CORRUPT naming the layer, page and element unless every value of the
// KV page (tail slots included: the writer stores them as zeros) is finite.
absl::Status check_kv_page(const KvLayout& lay, const uint8_t* page, const std::string& path,
                           uint32_t layer, uint64_t page_index);

// SSA_ERR_CORRUPT unless every code of the code page is < lay.pq_centroids
// (tail slots included: the writer stores them as zeros).
absl::Status check_code_page(const KvLayout& lay, const uint8_t* page, const std::string& path,
                             uint32_t layer, uint64_t page_index);

// SSA_ERR_CORRUPT unless every centroid coordinate is finite, every rotation
// (OPQ) finite and orthogonal, every key transform's query side (QPQ) finite and
// its inverse transpose, within tolerance.
absl::Status check_codebooks(const PqCodebooks& cb, const std::string& path, uint32_t layer);

// SSA_ERR_CORRUPT unless the query moments are what observing queries makes:
// every sum finite and symmetric with a non-negative diagonal, and all zero for
// a head of count 0.
absl::Status check_query_moments(const QueryMoments& qm, const std::string& path, uint32_t layer);

}  // namespace ssa::snap
