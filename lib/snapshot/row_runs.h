// Row runs: sections holding rows [first, first + count) of one layer's KV or code
// pages, without the rest of the pages they touch. A checkpoint writes the rows a
// turn added to a partially filled page this way instead of the whole page again,
// so it writes the turn's own bytes (docs/SNAPSHOT_FORMAT.md, "Row runs").
//
// A page is a sequence of blocks (KV: K of each head, then V of each head; codes:
// one block per head and code row), each holding page_tokens rows of `unit` bytes.
// A row run's body is, for each page it touches in order, the slice of its rows in
// that page: block by block, the slice's rows of the block.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <vector>

#include "absl/status/status.h"
#include "snapshot/format.h"
#include "store/held_range.h"
#include "store/kv_layout.h"

namespace ssa::snap {

struct RowShape {
  size_t blocks = 0;       // blocks per page
  size_t unit = 0;         // bytes of one row in one block
  uint32_t page_tokens = 0;
  size_t row_bytes() const { return blocks * unit; }  // bytes of one row in a run's body
};
RowShape row_shape(const KvLayout& lay, bool kv);

// Copies rows [a, b) (slots of one page) out of / into a page, in a run's order.
void gather_rows(const RowShape& sh, const uint8_t* page, uint32_t a, uint32_t b, uint8_t* out);
void scatter_rows(const RowShape& sh, const uint8_t* in, uint32_t a, uint32_t b, uint8_t* page);
// Whether two pages hold the same bytes in rows [a, b).
bool rows_equal(const RowShape& sh, const uint8_t* x, const uint8_t* y, uint32_t a, uint32_t b);
// Zeroes rows [a, page_tokens) of a page.
void zero_rows_from(const RowShape& sh, uint8_t* page, uint32_t a);

// The pieces of one layer's pages of one kind that row runs give: for each page
// that a row run written after the page's winning page run (or with no page run)
// touches, those row runs' entry indices in table order.
using RowPieces = std::map<uint64_t, std::vector<uint32_t>>;

// Checks the row-run entry `e` (index idx) of a layer against the shape: exact
// length, no overflow, every page it touches inside `held`. SSA_ERR_CORRUPT.
absl::Status check_row_run(const std::string& path, const SectionEntry& e, size_t idx,
                           const RowShape& sh, const HeldRange& held);

// From the row runs of one layer and kind (entry indices in table order) and the
// winning page run of each page (`src`, kNoSource = none): the pieces; then checks
// that every row below n_tokens of a page in [first_held, end_held) is held by its
// page run or a piece (SSA_ERR_CORRUPT naming the layer, page and row).
absl::Status compose_pieces(const std::string& path, const std::vector<SectionEntry>& entries,
                            const std::vector<uint32_t>& runs, const std::vector<uint32_t>& src,
                            uint32_t no_source, uint32_t page_tokens, uint64_t n_tokens,
                            uint64_t first_held, uint64_t end_held, uint32_t layer, bool kv,
                            RowPieces* out);

}  // namespace ssa::snap
