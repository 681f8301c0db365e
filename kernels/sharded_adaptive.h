// The adaptive heavy rule (SSA_METHOD_SSA_ADAPTIVE) of a sharded decode
// (lib/cuda/sharded_decode.cc drives it, between collectives): the global top k'
// candidates are found by the sharded top-k (sharded_topk.h) and listed by each
// rank; their score keys, gathered from every rank, sorted per row, give the
// same water-filling input as one device's (adaptive_heavy.cu): the k' largest
// proxy probabilities over the candidate total, descending. Every rank runs the
// water-filling over every row of the batch, so all agree on each row's |H|;
// the heavy set is then the sharded top-k of |H|.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "decode_types.h"

namespace ssa::cuda {

// keys[(batch_item * sel_heads + h) * stride + i]: the score key of the i-th
// listed candidate of the rank's row (item, h) (ws.heavy, ws.rows[].n_heavy of
// them, after the listing compaction), 0 (below every score) from there to the
// item's n_select. Rows of items the rank does not hold are not written.
cudaError_t shard_listed_keys(const DecodeBatch& b, const Workspace& ws, const ShardBatchItems& map, uint32_t* keys,
                              uint32_t stride, cudaStream_t stream);

// out[row][r * stride + i] = in[r][row][i]: the ranks' gathered keys, row by row.
cudaError_t shard_interleave_keys(const uint32_t* in, uint32_t ranks, uint32_t rows, uint32_t stride, uint32_t* out,
                                  cudaStream_t stream);

// Descending sort of each row's seg keys (rows x seg, contiguous); temp of
// shard_sort_temp_bytes(rows, seg) bytes.
size_t shard_sort_temp_bytes(uint32_t rows, uint32_t seg);
cudaError_t shard_sort_keys(void* temp, size_t temp_bytes, const uint32_t* in, uint32_t* out, uint32_t rows,
                            uint32_t seg, cudaStream_t stream);

// Per row: its global maximum proxy score key, budget k' (0: the row selects
// nothing) and candidate total w_all (sum of exp(s - max), every rank's).
struct ShardWaterRow {
  uint32_t max_key, kprime;
  double w_all;
};
// heavy[row] = |H| of water_fill over the first k' of the row's sorted keys
// (sorted + row * seg), their probabilities exp(key - max) / w_all into
// probs[row * seg ..], exactly as adaptive_heavy.cu computes them.
cudaError_t shard_water_fill(const uint32_t* sorted, uint32_t seg, const ShardWaterRow* rows, uint32_t n_rows,
                             double* probs, uint32_t* heavy, cudaStream_t stream);

}  // namespace ssa::cuda
