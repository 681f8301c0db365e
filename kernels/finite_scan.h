// Host entry point of kernels/finite_scan.cu: the NaN/Inf scan of an append's
// device K and V rows without copying them anywhere, for rows a rank of a group
// of processes does not keep (it checks every row it is given, so that rows all
// ranks were given refuse on all of them: docs/DISTRIBUTED.md).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::cuda {

// Enqueues on st: lowers first_bad[0] to the index of k's first NaN or infinite
// element among k[0..n), first_bad[1] to v's (device arrays of n elements of
// dtype t), as append_rows' scan does (exponent bits all ones).
cudaError_t scan_finite(DType t, const void* k, const void* v, uint64_t n, unsigned long long* first_bad,
                        cudaStream_t st);

}  // namespace ssa::cuda
