// CUDA errors as the library's statuses: a failed allocation is
// SSA_ERR_OUT_OF_MEMORY (and clears the error, so the device stays usable),
// anything else SSA_ERR_DEVICE.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "status.h"

namespace ssa::cuda {

inline absl::Status device_error(cudaError_t e, const char* what) {
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return make_error(SSA_ERR_OUT_OF_MEMORY, absl::StrCat(what, ": ", cudaGetErrorString(e)));
  }
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace ssa::cuda

#define SSA_CUDA_RETURN(expr, what)                                           \
  do {                                                                        \
    cudaError_t ssa_e_ = (expr);                                              \
    if (ssa_e_ != cudaSuccess) return ::ssa::cuda::device_error(ssa_e_, what); \
  } while (0)
