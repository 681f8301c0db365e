// Host entry point of kernels/finite_scan.cu: the first NaN or infinity among
// K or V elements in device memory, which the host scan (lib/cpu/finite_check.h)
// cannot read.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::cuda {

// Enqueues on st a scan of x[0, n) (elements of type t, device memory) that
// lowers *first (device, set to n or more by the caller) to the index of the
// first NaN or infinite element. n may be 0.
cudaError_t find_non_finite(DType t, const void* x, uint64_t n, unsigned long long* first, cudaStream_t st);

}  // namespace ssa::cuda
