// Launches of the decode stages with programmatic dependent launch (sm_90).
// A decode is a chain of short kernels, each reading what the previous one
// wrote. Launched plainly, a stage's grid is set up only after the previous grid
// has drained and flushed, a gap of a few microseconds per stage, which adds up
// over a decode's chain. With the launch attribute, the next grid is set up
// while the previous one runs and starts once the previous grid's blocks have
// all exited; every stage kernel begins with stage_begin(), which waits until
// the previous grid has completed and its writes are visible. So the stages
// still run strictly one after another; only the launch work overlaps.
// One stage releases its dependents early (stage_release_dependents): the
// lookup-table kernel, whose successor, PQ scoring, copies its first code words
// (which no stage writes) before it waits. Other stages do not: a waiting grid
// released early takes room on the multiprocessors from the grid still running.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "decode_types.h"

namespace ssa::cuda {

// First statement of every kernel launched with launch_stage: no global memory
// may be read or written before it (one exception, in the kernel after a stage
// that calls stage_release_dependents: reads of what no decode stage writes).
__device__ __forceinline__ void stage_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next stage's grid start before this one completes; only for a next
// stage that reads nothing this grid writes before its own stage_begin().
__device__ __forceinline__ void stage_release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
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
