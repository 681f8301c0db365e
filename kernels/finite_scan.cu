// The NaN/Inf scan alone (kernels/finite_scan.h): an element is NaN or infinite
// exactly when its exponent bits are all ones; each thread reports the first
// bad element it sees, atomicMin keeps the lowest.
#include <stdint.h>

#include "finite_scan.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxBlocks = 2048;

// blockIdx.y: 0 scans k, 1 scans v.
template <typename Bits, Bits kExponent>
__global__ void __launch_bounds__(kThreads) scan_kernel(const Bits* k, const Bits* v, uint64_t n,
                                                        unsigned long long* first_bad) {
  const Bits* src = blockIdx.y == 1 ? v : k;
  const uint64_t stride = uint64_t{gridDim.x} * kThreads;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    if ((src[i] & kExponent) == kExponent) {
      atomicMin(first_bad + blockIdx.y, static_cast<unsigned long long>(i));
      return;  // later elements of this thread are larger
    }
  }
}

template <typename Bits, Bits kExponent>
cudaError_t launch(const void* k, const void* v, uint64_t n, unsigned long long* first_bad, cudaStream_t st) {
  const uint64_t blocks = (n + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<uint32_t>(blocks < kMaxBlocks ? blocks : kMaxBlocks), 2);
  scan_kernel<Bits, kExponent><<<grid, kThreads, 0, st>>>(static_cast<const Bits*>(k), static_cast<const Bits*>(v),
                                                          n, first_bad);
  return cudaGetLastError();
}

}  // namespace

cudaError_t scan_finite(DType t, const void* k, const void* v, uint64_t n, unsigned long long* first_bad,
                        cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  switch (t) {
    case DType::kF32:
      return launch<uint32_t, 0x7F800000u>(k, v, n, first_bad, st);
    case DType::kF16:
      return launch<uint16_t, 0x7C00u>(k, v, n, first_bad, st);
    case DType::kBF16:
      return launch<uint16_t, 0x7F80u>(k, v, n, first_bad, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ssa::cuda
