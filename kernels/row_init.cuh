// A row's state at the start of a decode, set by the first stage that touches
// the row: init_rows.cu, or the PQ lookup-table kernel (pq_score.cu), which
// does it in the same launch.
#pragma once

#include "device_util.cuh"

namespace ssa::cuda {

// The state of row (item, h) before a sparse decode; its top-k histogram is zeroed
// by the caller.
__device__ inline RowState initial_row(const DecodeBatch& b, const DecodeItem& it) {
  RowState r{};
  r.max_key = 0u;
  r.min_key = 0xffffffffu;
  const uint32_t heavy = b.heavy == HeavyRule::kAdaptive ? 0u : it.n_heavy;
  r.n_heavy = heavy;
  r.topk_k = requested_topk(b, it);
  r.n_draws = b.sampling == Sampling::kNone ? 0u : it.n_select - heavy;
  return r;
}

// Zeroes a row's top-k histogram and its compaction counts (every pass), by the
// block's threads.
__device__ inline void clear_row_sums(const Workspace& ws, uint32_t row, uint32_t n_rows) {
  for (uint32_t i = threadIdx.x; i < kScoreBins; i += blockDim.x) ws.hist[size_t{row} * kScoreBins + i] = 0;
  for (uint32_t pass = 0; pass < ws.compact_passes; ++pass) {
    uint64_t* c = row_compact_counts(ws.compact_counts, pass, n_rows, row, ws.compact_blocks);
    for (uint32_t i = threadIdx.x; i < ws.compact_blocks; i += blockDim.x) c[i] = 0;
  }
}

}  // namespace ssa::cuda
