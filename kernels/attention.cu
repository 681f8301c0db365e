// The attention stage of a decode: the splits' partial results by the kernel
// that serves the launch set (tensor cores for dense rows, the cp.async gather
// for sparse rows, per KV group with group selection, CUDA cores for what those
// leave), then their merge.
#include "stages.h"

namespace ssa::cuda {

cudaError_t launch_split_attention(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                   bool all_dense, cudaStream_t st) {
  if (all_dense) return dense_mma_supported(b.shape) ? launch_dense_mma(b, plan, ws, st)
                                                     : launch_dense_split(b, plan, ws, st);
  if (group_attention(b)) return group_gather_supported(b.shape) ? launch_group_gather(b, plan, ws, st)
                                                                 : launch_group_split(b, plan, ws, st);
  return sparse_gather_supported(b.shape) ? launch_sparse_gather(b, plan, ws, st)
                                          : launch_sparse_split(b, plan, ws, st);
}

cudaError_t launch_attention(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             bool all_dense, cudaStream_t st) {
  const cudaError_t e = launch_split_attention(b, plan, ws, all_dense, st);
  return e != cudaSuccess ? e : launch_merge_splits(b, plan, ws, st);
}

}  // namespace ssa::cuda
