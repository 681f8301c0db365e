// Launches of the decode stages with programmatic dependent launch (sm_90).
// A decode is a chain of short kernels, each reading what the previous one
// wrote. Launched plainly, each waits for the previous grid to drain before its
// own blocks are even scheduled, which at 128K tokens costs about as much as a
// small kernel runs. With the launch attribute, the next stage's blocks may be
// scheduled while the previous stage's last blocks still run; every stage kernel
// begins with stage_begin(), which waits until the previous grid has completed
// and its writes are visible, and only then lets its own dependents launch. So
// the stages still run strictly one after another, only their launches overlap.
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
  // All blocks of this grid being resident is what lets the next stage launch,
  // so its waiting blocks never take room this grid still needs.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
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
