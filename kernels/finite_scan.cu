// NaN/Inf scan of device K and V before a CUDA session's append keeps them (one
// NaN key would poison every later decode that reads it). An element is NaN or
// infinite exactly when its exponent bits are all ones, so the scan compares bit
// patterns and never converts. The 16-byte-aligned middle of the array is read
// in 16-byte loads, the few elements before and after it one by one. Each thread
// walks its indices in increasing order and stops at its first bad one;
// atomicMin keeps the lowest of all threads.
#include <stdint.h>

#include "finite_scan.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxBlocks = 4096;

template <typename Bits, Bits kExponent>
__device__ __forceinline__ bool bad(Bits b) {
  return (b & kExponent) == kExponent;
}

// Elements [0, head) and [head + kPerVec * n_vec, n) one by one; the n_vec
// 16-byte vectors from element head on.
template <typename Bits, Bits kExponent>
__global__ void __launch_bounds__(kThreads) scan_kernel(const Bits* x, uint64_t n, uint64_t head, uint64_t n_vec,
                                                        unsigned long long* first) {
  constexpr uint32_t kPerVec = 16 / sizeof(Bits);
  const uint64_t tid = uint64_t{blockIdx.x} * kThreads + threadIdx.x;
  const uint64_t stride = uint64_t{gridDim.x} * kThreads;
  if (tid < head && bad<Bits, kExponent>(x[tid])) atomicMin(first, static_cast<unsigned long long>(tid));
  const uint64_t tail = head + kPerVec * n_vec;
  if (tail + tid < n && bad<Bits, kExponent>(x[tail + tid])) {
    atomicMin(first, static_cast<unsigned long long>(tail + tid));
  }
  const uint4* v = reinterpret_cast<const uint4*>(x + head);
  for (uint64_t i = tid; i < n_vec; i += stride) {
    union {
      uint4 u;
      Bits b[kPerVec];
    } w;
    w.u = v[i];
#pragma unroll
    for (uint32_t e = 0; e < kPerVec; ++e) {
      if (bad<Bits, kExponent>(w.b[e])) {
        atomicMin(first, static_cast<unsigned long long>(head + i * kPerVec + e));
        return;
      }
    }
  }
}

template <typename Bits, Bits kExponent>
cudaError_t launch(const void* x, uint64_t n, unsigned long long* first, cudaStream_t st) {
  constexpr uint32_t kPerVec = 16 / sizeof(Bits);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(x);
  // Elements before the first 16-byte boundary (a whole number of them: a Bits
  // array is element-aligned), at most all n.
  uint64_t head = ((16 - addr % 16) % 16) / sizeof(Bits);
  if (head > n) head = n;
  const uint64_t n_vec = (n - head) / kPerVec;
  const uint64_t work = n_vec > kPerVec ? n_vec : kPerVec;  // at least the head and tail threads
  const uint64_t blocks = (work + kThreads - 1) / kThreads;
  const uint32_t grid = static_cast<uint32_t>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  scan_kernel<Bits, kExponent><<<grid, kThreads, 0, st>>>(static_cast<const Bits*>(x), n, head, n_vec, first);
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
