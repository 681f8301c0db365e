// A build without the CUDA backend: CMake compiles this file instead of the rest
// of lib/cuda and kernels/ (lib/sources.cmake). Runtimes asking for CUDA then get
// SSA_ERR_UNSUPPORTED, and AUTO picks the CPU.
#include "backend.h"

namespace ssa {

const Backend* cuda_backend() { return nullptr; }

}  // namespace ssa
