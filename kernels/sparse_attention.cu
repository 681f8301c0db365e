// Sparse rows on CUDA cores: the split-K kernel (split_attention.cuh) over each
// row's read set. Only for what the gather kernel (sparse_gather_attention.cu:
// f16/bf16, head dims 64-256) leaves.
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

}  // namespace ssa::cuda
