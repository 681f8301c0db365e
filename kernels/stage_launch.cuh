// Launches of the decode stages with programmatic dependent launch (sm_90).
// A decode is a chain of short kernels, each reading what the previous one
// wrote. Launched plainly, a stage's grid is set up only after the previous grid
// has drained and flushed, a gap of a few microseconds per stage: about a tenth
// of a 128K-token decode. With the launch attribute, the next grid is set up
// while the previous one runs and starts once the previous grid's blocks have
// all exited; every stage kernel begins with stage_begin(), which waits until
// the previous grid has completed and its writes are visible. So the stages
// still run strictly one after another; only the launch work overlaps.
// No stage signals its dependents early (griddepcontrol.launch_dependents): that
// lets the next grid's waiting blocks take room on the multiprocessors while the
// previous grid still runs, and measured 2-3% slower at batch 16
// (bench/RESULTS.md).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "decode_types.h"

namespace ssa::cuda {

// First statement of every kernel launched with launch_stage: no global memory
// may be read or written before it.
__device__ __forceinline__ void stage_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
cudaError_t launch_stage(const DecodeBatch& b, void (*kernel)(Params...), dim3 grid, dim3 block,
                         size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = b.overlap_launches ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace ssa::cuda
