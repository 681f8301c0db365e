// Sparse rows on CUDA cores: the split-K kernel (split_attention.cuh) over each
// row's read set. Only for what the gather kernels leave: per head
// (sparse_gather_attention.cu: f16/bf16, head dims 64-256), and per KV group with
// group selection (group_attention.cu: f16/bf16, head dims 64-256, groups 2-16).
#include <algorithm>

#include "split_attention.cuh"

namespace ssa::cuda {

cudaError_t launch_sparse_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      e = split_attention::launch_split<D, T, 1, true>(b, plan, ws, st);
    });
  });
  return e;
}

// q heads of one KV group per block with group selection: the dense kernel's
// choice (dense_heads_per_block), at most 4 at head dim 512, whose 16 elements
// per lane of q and of the accumulator per head would not fit the registers.
uint32_t group_split_heads(const DecodeShape& s) {
  const uint32_t gh = dense_heads_per_block(s.group());
  return s.head_dim >= 512 ? std::min(gh, 4u) : gh;
}

cudaError_t launch_group_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  if (!b.grouped()) return e;  // per-head read sets differ within a group
  const uint32_t gh = group_split_heads(b.shape);
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      using namespace split_attention;
      if (gh == 4) e = launch_split<D, T, 4, true>(b, plan, ws, st);
      else if (gh == 2) e = launch_split<D, T, 2, true>(b, plan, ws, st);
      else if (gh == 1) e = launch_split<D, T, 1, true>(b, plan, ws, st);
      else if constexpr (D < 512) e = launch_split<D, T, 8, true>(b, plan, ws, st);  // gh == 8
    });
  });
  return e;
}

}  // namespace ssa::cuda
