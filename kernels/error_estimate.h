// The error estimate of an error-targeted decode round on the GPU (host entry
// point; the math is lib/select/error_target.cc's, see error_estimate.cu).
#pragma once

#include <cuda_runtime.h>

#include "decode_types.h"

namespace ssa::cuda {

// Scratch of one estimate: split partials, sized by estimate_scratch_bytes.
size_t estimate_scratch_bytes(const DecodeBatch& b, const WorkspacePlan& plan);

// After run_decode of a batch with record_draws (group selection off), writes
// for every (item, q head) row r = item * n_q_heads + h the relative variance per
// draw V[r] of the self-normalised estimate (delta method, with-replacement
// draws; infinite where it cannot be estimated: fewer than 2 draws, o = 0; 0 for
// a row without residual weight, or a dense item). scratch: estimate_scratch_bytes
// bytes of device memory; V: plan.rows doubles of device memory.
cudaError_t launch_error_estimate(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                  void* scratch, double* V, cudaStream_t st);

}  // namespace ssa::cuda
