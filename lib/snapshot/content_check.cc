#include "snapshot/content_check.h"

#include "absl/strings/str_cat.h"
#include "cpu/finite_check.h"
#include "status.h"

namespace ssa::snap {

absl::Status check_kv_page(const KvLayout& lay, const uint8_t* page, const std::string& path,
                           uint32_t layer, uint64_t page_index) {
  const size_t n = lay.kv_page_bytes() / lay.elem_bytes();
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
  if (lay.pq_centroids >= 256) return absl::OkStatus();  // every byte names a centroid
  const size_t n = lay.code_page_bytes();
  uint8_t top = 0;
  for (size_t i = 0; i < n; ++i) top = page[i] > top ? page[i] : top;  // vectorises
  if (top < lay.pq_centroids) return absl::OkStatus();
  size_t at = 0;
  while (page[at] < lay.pq_centroids) ++at;
  const size_t per_head = size_t{lay.pq_subspaces} * lay.page_tokens;
  return make_error(SSA_ERR_CORRUPT,
                    absl::StrCat("snapshot '", path, "': layer ", layer, " code page ", page_index,
                                 " holds code ", page[at], " (head ", at / per_head, ", subspace ",
                                 (at % per_head) / lay.page_tokens, ", slot ",
                                 at % lay.page_tokens, ") but the codebooks have ",
                                 lay.pq_centroids, " centroids"));
}

absl::Status check_codebooks(const PqCodebooks& cb, const std::string& path, uint32_t layer) {
  const size_t n = cb.data.size();
  const size_t bad = first_non_finite(DType::kF32, cb.data.data(), n);
  if (bad == n) return absl::OkStatus();
  return make_error(SSA_ERR_CORRUPT,
                    absl::StrCat("snapshot '", path, "': layer ", layer,
                                 " codebooks hold a non-finite centroid coordinate (float ", bad,
                                 " of ", n, ")"));
}

}  // namespace ssa::snap
