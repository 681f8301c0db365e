#include "snapshot/row_runs.h"

#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "status.h"

namespace ssa::snap {

RowShape row_shape(const KvLayout& lay, bool kv) {
  RowShape sh;
  sh.page_tokens = lay.page_tokens;
  if (kv) {
    sh.blocks = size_t{2} * lay.n_kv_heads;
    sh.unit = lay.row_bytes();
  } else {
    sh.blocks = lay.code_page_bytes() / lay.page_tokens;
    sh.unit = 1;
  }
  return sh;
}

void gather_rows(const RowShape& sh, const uint8_t* page, uint32_t a, uint32_t b, uint8_t* out) {
  const size_t n = size_t{b - a} * sh.unit, stride = size_t{sh.page_tokens} * sh.unit;
  for (size_t k = 0; k < sh.blocks; ++k) memcpy(out + k * n, page + k * stride + size_t{a} * sh.unit, n);
}

void scatter_rows(const RowShape& sh, const uint8_t* in, uint32_t a, uint32_t b, uint8_t* page) {
  const size_t n = size_t{b - a} * sh.unit, stride = size_t{sh.page_tokens} * sh.unit;
  for (size_t k = 0; k < sh.blocks; ++k) memcpy(page + k * stride + size_t{a} * sh.unit, in + k * n, n);
}

bool rows_equal(const RowShape& sh, const uint8_t* x, const uint8_t* y, uint32_t a, uint32_t b) {
  const size_t n = size_t{b - a} * sh.unit, stride = size_t{sh.page_tokens} * sh.unit;
  for (size_t k = 0; k < sh.blocks; ++k) {
    const size_t off = k * stride + size_t{a} * sh.unit;
    if (memcmp(x + off, y + off, n) != 0) return false;
  }
  return true;
}

void zero_rows_from(const RowShape& sh, uint8_t* page, uint32_t a) {
  if (a >= sh.page_tokens) return;
  const size_t n = size_t{sh.page_tokens - a} * sh.unit, stride = size_t{sh.page_tokens} * sh.unit;
  for (size_t k = 0; k < sh.blocks; ++k) memset(page + k * stride + size_t{a} * sh.unit, 0, n);
}

namespace {
std::string what(const SectionEntry& e, size_t idx) {
  return absl::StrCat(section_kind_name(e.kind), " section #", idx, " (layer ", e.layer, ", rows ", e.first,
                      " + ", e.count, ")");
}
}  // namespace

absl::Status check_row_run(const std::string& path, const SectionEntry& e, size_t idx, const RowShape& sh,
                           const HeldRange& held) {
  auto bad = [&](const std::string& why) {
    return make_error(SSA_ERR_CORRUPT, absl::StrCat("snapshot '", path, "': ", what(e, idx), " ", why));
  };
  // A layer holds at most 2^32-1 tokens: so does every row index of a run.
  constexpr uint64_t kRowLimit = uint64_t{1} << 32;
  if (e.count == 0 || e.first >= kRowLimit || e.count > kRowLimit - e.first) {
    return bad("holds rows beyond a layer's limit of 2^32-1 tokens");
  }
  if (e.length % sh.row_bytes() != 0 || e.length / sh.row_bytes() != e.count) {
    return bad(absl::StrCat("holds ", e.length, " bytes, not ", e.count, " rows of ", sh.row_bytes()));
  }
  const uint64_t first_page = e.first / sh.page_tokens, last_page = (e.first + e.count - 1) / sh.page_tokens;
  if (!held.holds_page(first_page, sh.page_tokens) || !held.holds_page(last_page, sh.page_tokens)) {
    return bad("holds rows outside the shard this file is part of");
  }
  return absl::OkStatus();
}

absl::Status compose_pieces(const std::string& path, const std::vector<SectionEntry>& entries,
                            const std::vector<uint32_t>& runs, const std::vector<uint32_t>& src,
                            uint32_t no_source, uint32_t page_tokens, uint64_t n_tokens,
                            uint64_t first_held, uint64_t end_held, uint32_t layer, bool kv,
                            RowPieces* out) {
  out->clear();
  for (uint32_t r : runs) {
    const SectionEntry& e = entries[r];
    const uint64_t end = std::min<uint64_t>((e.first + e.count - 1) / page_tokens + 1, src.size());
    for (uint64_t j = e.first / page_tokens; j < end; ++j) {
      // Entries come in table order: a later page run supersedes this run's rows.
      if (src[j] == no_source || src[j] < r) (*out)[j].push_back(r);
    }
  }
  std::vector<bool> held_rows(page_tokens);
  for (const auto& [j, pieces] : *out) {
    if (j < first_held || j >= end_held || src[j] != no_source) continue;
    const uint32_t valid = static_cast<uint32_t>(std::min<uint64_t>(page_tokens, n_tokens - j * page_tokens));
    std::fill(held_rows.begin(), held_rows.end(), false);
    for (uint32_t r : pieces) {
      const SectionEntry& e = entries[r];
      const uint64_t a = std::max(e.first, j * page_tokens), b = std::min(e.first + e.count, (j + 1) * page_tokens);
      for (uint64_t t = a; t < b; ++t) held_rows[t - j * page_tokens] = true;
    }
    for (uint32_t t = 0; t < valid; ++t) {
      if (!held_rows[t]) {
        return make_error(SSA_ERR_CORRUPT, absl::StrCat("snapshot '", path, "': layer ", layer, kv ? " KV" : " code",
                                                        " page ", j, " row ", t, " is missing"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa::snap
