#include "snapshot/content_check.h"

#include <string.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "cpu/finite_check.h"
#include "index/query_transform.h"
#include "index/rotation.h"
#include "status.h"

namespace ssa::snap {
namespace {

// Word-at-a-time tests over 8-byte words (pages are multiples of 64 bytes; a
// tail is handled bytewise by the callers' exact search). Each lane's masked
// value plus `add` reaches the lane's top bit exactly when the lane is bad, and
// never carries into the next lane.
struct Lanes {
  uint64_t mask, add, top;
};
constexpr uint64_t rep16(uint64_t v) { return v * 0x0001000100010001ull; }
constexpr uint64_t rep32(uint64_t v) { return v * 0x0000000100000001ull; }

Lanes exponent_lanes(DType t) {
  switch (t) {  // all exponent bits set: Inf or NaN
    case DType::kF32: return {rep32(0x7f800000u), rep32(0x00800000u), rep32(0x80000000u)};
    case DType::kF16: return {rep16(0x7c00u), rep16(0x0400u), rep16(0x8000u)};
    default: return {rep16(0x7f80u), rep16(0x0080u), rep16(0x8000u)};
  }
}

// True when some 8-byte word of [p, p + n) (n a multiple of 8) has a bad lane.
bool any_bad_lane(const uint8_t* p, size_t n, Lanes l) {
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    acc |= ((w & l.mask) + l.add) & l.top;
  }
  return acc != 0;
}

// True when some byte of [p, p + n) (n a multiple of 8) is >= k (2 <= k <= 255).
bool any_byte_at_least(const uint8_t* p, size_t n, uint32_t k) {
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full, kHigh = 0x8080808080808080ull;
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  uint64_t acc = 0;
  if (k <= 128) {  // b >= k  <=>  high bit set, or low 7 bits + (128 - k) reach 128
    const uint64_t add = (128 - k) * kOnes;
    for (size_t i = 0; i + 8 <= n; i += 8) {
      uint64_t w;
      memcpy(&w, p + i, 8);
      acc |= (((w & kLow7) + add) | w) & kHigh;
    }
  } else {  // b >= k  <=>  high bit set and low 7 bits + (256 - k) reach 128
    const uint64_t add = (256 - k) * kOnes;
    for (size_t i = 0; i + 8 <= n; i += 8) {
      uint64_t w;
      memcpy(&w, p + i, 8);
      acc |= ((w & kLow7) + add) & w & kHigh;
    }
  }
  return acc != 0;
}

// True when some nibble of [p, p + n) (n a multiple of 8) is >= k (2 <= k <= 15):
// each byte's low (then high) nibble plus 16 - k reaches 16 exactly when bad,
// and stays below 32, so no lane carries into the next.
bool any_nibble_at_least(const uint8_t* p, size_t n, uint32_t k) {
  constexpr uint64_t kLow4 = 0x0f0f0f0f0f0f0f0full, kBit4 = 0x1010101010101010ull;
  const uint64_t add = (16 - k) * 0x0101010101010101ull;
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    acc |= ((w & kLow4) + add) | (((w >> 4) & kLow4) + add);
  }
  return (acc & kBit4) != 0;
}

absl::Status bad_code(const KvLayout& lay, const std::string& path, uint32_t layer, uint64_t page_index,
                      size_t at, uint32_t subspace_in_row, uint32_t code) {
  const size_t per_head = size_t{lay.code_rows()} * lay.page_tokens;
  const size_t row = (at % per_head) / lay.page_tokens;
  const size_t subspace = lay.code_bits == 4 ? 2 * row + subspace_in_row : row;
  return make_error(SSA_ERR_CORRUPT,
                    absl::StrCat("snapshot '", path, "': layer ", layer, " code page ", page_index,
                                 " holds code ", code, " (head ", at / per_head, ", subspace ", subspace,
                                 ", slot ", at % lay.page_tokens, ") but the codebooks have ",
                                 lay.pq_centroids, " centroids"));
}

}  // namespace

absl::Status check_kv_page(const KvLayout& lay, const uint8_t* page, const std::string& path,
                           uint32_t layer, uint64_t page_index) {
  const size_t n = lay.kv_page_bytes() / lay.elem_bytes();
  const size_t bytes = lay.kv_page_bytes();
  if (bytes % 8 == 0 && !any_bad_lane(page, bytes, exponent_lanes(lay.dtype))) return absl::OkStatus();
  const size_t bad = first_non_finite(lay.dtype, page, n);
  if (bad == n) return absl::OkStatus();
  const size_t half = n / 2;  // K rows, then V rows
  const size_t row = (bad % half) / lay.head_dim;
  return make_error(SSA_ERR_CORRUPT,
                    absl::StrCat("snapshot '", path, "': layer ", layer, " KV page ", page_index,
                                 " holds a non-finite ", bad < half ? "K" : "V", " value (head ",
                                 row / lay.page_tokens, ", slot ", row % lay.page_tokens,
                                 "); sessions never hold NaN or Inf"));
}

absl::Status check_code_page(const KvLayout& lay, const uint8_t* page, const std::string& path,
                             uint32_t layer, uint64_t page_index) {
  const size_t n = lay.code_page_bytes();
  const size_t words = n / 8 * 8;
  const uint32_t K = lay.pq_centroids;
  if (lay.code_bits == 4) {
    if (K >= 16) return absl::OkStatus();  // every nibble names a centroid
    bool bad = any_nibble_at_least(page, words, K);
    for (size_t i = words; i < n; ++i) bad |= (page[i] & 0x0fu) >= K || (page[i] >> 4) >= K;
    if (!bad) return absl::OkStatus();
    size_t at = 0;
    while ((page[at] & 0x0fu) < K && (page[at] >> 4) < K) ++at;
    const bool low = (page[at] & 0x0fu) >= K;
    return bad_code(lay, path, layer, page_index, at, low ? 0 : 1, low ? page[at] & 0x0fu : page[at] >> 4);
  }
  if (K >= 256) return absl::OkStatus();  // every byte names a centroid
  bool bad = any_byte_at_least(page, words, K);
  for (size_t i = words; i < n; ++i) bad |= page[i] >= K;
  if (!bad) return absl::OkStatus();
  size_t at = 0;
  while (page[at] < K) ++at;
  return bad_code(lay, path, layer, page_index, at, 0, page[at]);
}

absl::Status check_codebooks(const PqCodebooks& cb, const std::string& path, uint32_t layer) {
  const size_t n = cb.data.size();
  const size_t bad = first_non_finite(DType::kF32, cb.data.data(), n);
  if (bad != n) {
    return make_error(SSA_ERR_CORRUPT,
                      absl::StrCat("snapshot '", path, "': layer ", layer,
                                   " codebooks hold a non-finite centroid coordinate (float ", bad,
                                   " of ", n, ")"));
  }
  if (!cb.rotated()) return absl::OkStatus();
  const uint32_t d = cb.head_dim();
  if (!cb.query_transform.empty()) {
    // A query side that is not the key transform's inverse transpose would make
    // the proxy score something other than q . k.
    for (uint32_t h = 0; h < cb.n_kv_heads; ++h) {
      const double err = inverse_transpose_error(cb.rotation_of(h), cb.query_transform_of(h), d);
      if (!(err <= kTransformTolerance)) {
        return make_error(SSA_ERR_CORRUPT,
                          absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h,
                                       " query transform is not the key transform's inverse transpose (max |T^T Q - I| = ",
                                       err, ", tolerance ", kTransformTolerance, ")"));
      }
    }
    return absl::OkStatus();
  }
  // A rotation that is not orthogonal would make the proxy score something
  // other than q . k; a non-finite one every score NaN.
  for (uint32_t h = 0; h < cb.n_kv_heads; ++h) {
    const double err = orthogonality_error(cb.rotation_of(h), d);
    if (!(err <= kRotationTolerance)) {
      return make_error(SSA_ERR_CORRUPT,
                        absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h,
                                     " rotation is not orthogonal (max |R R^T - I| = ", err,
                                     ", tolerance ", kRotationTolerance, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status check_query_moments(const QueryMoments& qm, const std::string& path, uint32_t layer) {
  const uint32_t d = qm.head_dim;
  for (uint32_t h = 0; h < qm.n_kv_heads; ++h) {
    if (qm.count[h] > kMaxQueryCount) {
      return make_error(SSA_ERR_CORRUPT, absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h,
                                                      " query moments count ", qm.count[h], " queries, more than ",
                                                      kMaxQueryCount));
    }
    const double* s = qm.sum_of(h);
    for (uint32_t i = 0; i < d; ++i) {
      for (uint32_t j = 0; j < d; ++j) {
        const double v = s[size_t{i} * d + j];
        // A sum of q q^T is symmetric with |s_ij| <= sqrt(s_ii s_jj) (Cauchy-Schwarz;
        // a little slack for the rounding of the sums).
        const double bound = std::sqrt(std::fabs(s[size_t{i} * d + i]) * std::fabs(s[size_t{j} * d + j])) * (1 + 1e-6);
        const bool bad = !std::isfinite(v) || v != s[size_t{j} * d + i] || (i == j && v < 0.0) ||
                         (qm.count[h] == 0 && v != 0.0) || !(std::fabs(v) <= bound);
        if (bad) {
          return make_error(SSA_ERR_CORRUPT,
                            absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h,
                                         " query moments are not those of observed queries (entry ", i, ", ", j,
                                         " = ", v, ", count ", qm.count[h], ")"));
        }
      }
    }
  }
  if (qm.recent_count.empty()) return absl::OkStatus();  // a version 3 file: none kept
  for (uint32_t h = 0; h < qm.n_kv_heads; ++h) {
    const uint64_t kept = qm.recent_count[h];
    if (kept > kRecentQueries || kept > qm.count[h]) {
      return make_error(SSA_ERR_CORRUPT, absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h, " keeps ",
                                                      kept, " recent queries of ", qm.count[h], " observed (at most ",
                                                      kRecentQueries, ")"));
    }
    // Each kept query is one of the observed ones, so its squared entries are
    // parts of the moment sums' diagonal; the rows after the kept ones are zero.
    const double* s = qm.sum_of(h);
    const float* rows = qm.recent_of(h);
    for (uint64_t r = 0; r < kRecentQueries; ++r) {
      for (uint32_t a = 0; a < d; ++a) {
        const double v = rows[r * d + a];
        const bool bad = !std::isfinite(v) || (r >= kept ? v != 0.0 : v * v > s[size_t{a} * d + a] * (1 + 1e-6) + 1e-30);
        if (bad) {
          return make_error(SSA_ERR_CORRUPT,
                            absl::StrCat("snapshot '", path, "': layer ", layer, " KV head ", h, " recent query ", r,
                                         " entry ", a, " = ", v, " is not one of the observed queries (", kept,
                                         " kept)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa::snap
