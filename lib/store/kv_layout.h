// Byte layout of one session's pages. Both backends and the snapshot format use it.
//
//   KV page  (page_tokens tokens):  K[n_kv_heads][page_tokens][head_dim] then
//                                   V[n_kv_heads][page_tokens][head_dim], kv dtype.
//   code page (same tokens):        codes[n_kv_heads][code_rows][page_tokens], u8.
//     8-bit codes: code_rows = pq_subspaces, row m holds subspace m's codes.
//     4-bit codes: code_rows = pq_subspaces / 2, row r holds subspace 2r in the
//                  low nibble and subspace 2r + 1 in the high nibble.
//
// Head-major pages keep one head's rows contiguous for dense scans; subspace-major
// codes let the proxy scorer load the codes of 8..32 consecutive tokens at once
// (4-bit: 32 tokens x 2 subspaces in one 256-bit register).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"

namespace ssa {

struct KvLayout {
  uint32_t n_layers = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kF16;
  uint32_t pq_subspaces = 16, pq_centroids = 256;
  uint32_t code_bits = 8;  // 8 (SSA_PROXY_PQ, _OPQ) or 4 (SSA_PROXY_PQ4, _OPQ4)
  uint32_t page_tokens = 256;

  uint32_t group_size() const { return n_q_heads / n_kv_heads; }
  uint32_t sub_dim() const { return head_dim / pq_subspaces; }
  size_t elem_bytes() const { return dtype_bytes(dtype); }
  size_t row_bytes() const { return head_dim * elem_bytes(); }
  size_t token_bytes() const { return n_kv_heads * row_bytes(); }  // K or V of one token
  size_t kv_page_bytes() const { return 2 * page_tokens * token_bytes(); }
  // Bytes of codes per token per KV head.
  uint32_t code_rows() const { return code_bits == 4 ? pq_subspaces / 2 : pq_subspaces; }
  size_t code_page_bytes() const { return size_t{n_kv_heads} * code_rows() * page_tokens; }

  // Byte offset of the K row (head, slot) in a KV page; V rows follow all K rows.
  size_t k_offset(uint32_t head, uint32_t slot) const {
    return (size_t{head} * page_tokens + slot) * row_bytes();
  }
  size_t v_offset(uint32_t head, uint32_t slot) const {
    return size_t{page_tokens} * token_bytes() + k_offset(head, slot);
  }
  // Offset of code row `row` (< code_rows()) of `head` in a code page;
  // page_tokens bytes follow.
  size_t code_offset(uint32_t head, uint32_t row) const {
    return (size_t{head} * code_rows() + row) * page_tokens;
  }
  // The code of (head, subspace, slot) in a code page, and its store.
  uint32_t code_at(const uint8_t* page, uint32_t head, uint32_t subspace, uint32_t slot) const {
    if (code_bits == 8) return page[code_offset(head, subspace) + slot];
    const uint8_t b = page[code_offset(head, subspace / 2) + slot];
    return subspace % 2 == 0 ? b & 0x0fu : b >> 4;
  }
  void set_code(uint8_t* page, uint32_t head, uint32_t subspace, uint32_t slot, uint32_t code) const {
    if (code_bits == 8) {
      page[code_offset(head, subspace) + slot] = static_cast<uint8_t>(code);
      return;
    }
    uint8_t& b = page[code_offset(head, subspace / 2) + slot];
    b = subspace % 2 == 0 ? static_cast<uint8_t>((b & 0xf0u) | code) : static_cast<uint8_t>((b & 0x0fu) | (code << 4));
  }
  uint64_t pages_for(uint64_t tokens) const { return (tokens + page_tokens - 1) / page_tokens; }
};

}  // namespace ssa
