// Dense rows on CUDA cores: the split-K kernel (split_attention.cuh) over every
// token, GH q heads of one GQA group per block, so each K/V row is read once for
// all of them. Only for what the tensor-core kernel (dense_attention_mma.cu:
// f16/bf16, head dims 64-256, groups <= 16) leaves.
#include "split_attention.cuh"

namespace ssa::cuda {

// Heads of one GQA group that one dense block serves.
uint32_t dense_heads_per_block(uint32_t group) {
  for (uint32_t gh : {8u, 4u, 2u}) {
    if (group % gh == 0) return gh;
  }
  return 1;
}

cudaError_t launch_dense_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  const uint32_t gh = dense_heads_per_block(b.shape.group());
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      using namespace split_attention;
      if (gh == 8) e = launch_split<D, T, 8, false>(b, plan, ws, st);
      else if (gh == 4) e = launch_split<D, T, 4, false>(b, plan, ws, st);
      else if (gh == 2) e = launch_split<D, T, 2, false>(b, plan, ws, st);
      else e = launch_split<D, T, 1, false>(b, plan, ws, st);
    });
  });
  return e;
}

}  // namespace ssa::cuda
