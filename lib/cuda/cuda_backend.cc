// The CUDA backend as the core sees it (lib/backend.h). Its operations are
// defined in the files of their idea (lib/cuda/cuda_backend.h lists them).
#include "cuda_backend.h"

namespace ssa {

const Backend* cuda_backend() {
  static const cuda::CudaBackend backend{};
  return &backend;
}

}  // namespace ssa
