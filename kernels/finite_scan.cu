// NaN/Inf scan of device K and V before a CUDA session's append keeps them (one
// NaN key would poison every later decode that reads it). An element is NaN or
// infinite exactly when its exponent bits are all ones, so the scan compares bit
// patterns and never converts. Each thread walks its indices in increasing order
// and stops at its first bad one; atomicMin keeps the lowest of all threads.
#include "finite_scan.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxBlocks = 4096;

template <typename Bits, Bits kExponent>
__global__ void __launch_bounds__(kThreads) scan_kernel(const Bits* x, uint64_t n, unsigned long long* first) {
  const uint64_t stride = uint64_t{gridDim.x} * kThreads;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    if ((x[i] & kExponent) == kExponent) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

template <typename Bits, Bits kExponent>
cudaError_t launch(const void* x, uint64_t n, unsigned long long* first, cudaStream_t st) {
  const uint64_t blocks = (n + kThreads - 1) / kThreads;
  const uint32_t grid = static_cast<uint32_t>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  scan_kernel<Bits, kExponent><<<grid, kThreads, 0, st>>>(static_cast<const Bits*>(x), n, first);
  return cudaGetLastError();
}

}  // namespace

cudaError_t find_non_finite(DType t, const void* x, uint64_t n, unsigned long long* first, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  switch (t) {
    case DType::kF32: return launch<uint32_t, 0x7F800000u>(x, n, first, st);
    case DType::kF16: return launch<uint16_t, 0x7C00u>(x, n, first, st);
    case DType::kBF16: return launch<uint16_t, 0x7F80u>(x, n, first, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ssa::cuda
