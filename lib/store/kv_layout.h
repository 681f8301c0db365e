// Byte layout of one session's pages. Both backends and the snapshot format use it.
//
//   KV page  (page_tokens tokens):  K[n_kv_heads][page_tokens][head_dim] then
//                                   V[n_kv_heads][page_tokens][head_dim], kv dtype.
//   code page (same tokens):        codes[n_kv_heads][pq_subspaces][page_tokens], u8.
//
// Head-major pages keep one head's rows contiguous for dense scans; subspace-major
// codes let the proxy scorer load the codes of 8..32 consecutive tokens at once.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"

namespace ssa {

struct KvLayout {
  uint32_t n_layers = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kF16;
  uint32_t pq_subspaces = 16, pq_centroids = 256;
  uint32_t page_tokens = 256;

  uint32_t group_size() const { return n_q_heads / n_kv_heads; }
  uint32_t sub_dim() const { return head_dim / pq_subspaces; }
  size_t elem_bytes() const { return dtype_bytes(dtype); }
  size_t row_bytes() const { return head_dim * elem_bytes(); }
  size_t token_bytes() const { return n_kv_heads * row_bytes(); }  // K or V of one token
  size_t kv_page_bytes() const { return 2 * page_tokens * token_bytes(); }
  size_t code_page_bytes() const { return size_t{n_kv_heads} * pq_subspaces * page_tokens; }

  // Byte offset of the K row (head, slot) in a KV page; V rows follow all K rows.
  size_t k_offset(uint32_t head, uint32_t slot) const {
    return (size_t{head} * page_tokens + slot) * row_bytes();
  }
  size_t v_offset(uint32_t head, uint32_t slot) const {
    return size_t{page_tokens} * token_bytes() + k_offset(head, slot);
  }
  // Offset of the codes of (head, subspace) in a code page; page_tokens bytes follow.
  size_t code_offset(uint32_t head, uint32_t subspace) const {
    return (size_t{head} * pq_subspaces + subspace) * page_tokens;
  }
  uint64_t pages_for(uint64_t tokens) const { return (tokens + page_tokens - 1) / page_tokens; }
};

}  // namespace ssa
