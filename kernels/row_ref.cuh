// The (item, selection head) row a block of a per-row grid (x: blocks of the
// row, y: selection head, DecodeBatch::sel_heads(), z: item) works on, and that
// row's slices of the workspace.
#pragma once

#include "device_util.cuh"

namespace ssa::cuda {

struct RowRef {
  const DecodeItem* it;
  uint32_t h, row;
};

__device__ inline RowRef row_ref(const DecodeBatch& b) {
  RowRef r;
  r.it = &b.item(blockIdx.z);
  r.h = blockIdx.y;
  r.row = row_of(blockIdx.z, blockIdx.y, b.sel_heads());
  return r;
}

__device__ __forceinline__ float* row_scores(const Workspace& ws, const RowRef& r) {
  return ws.scores + row_token_base(*r.it, r.h);
}
__device__ __forceinline__ size_t row_select(const RowRef& r) {
  return r.it->select_base + size_t{r.h} * r.it->select_cap;
}

}  // namespace ssa::cuda
