// Head-dim dispatch: the one place that maps a run-time head dim onto the
// compile-time ones the kernels are instantiated for, and the per-lane split of a
// row (EPT elements per lane, TPR lanes per row; TPR divides 32).
#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "decode_types.h"

namespace ssa::cuda {

template <int D>
struct RowSplit {
  static constexpr int kEpt = D <= 256 ? 8 : 16;
  static constexpr int kTpr = D / kEpt;
  static_assert(kTpr >= 1 && kTpr <= 32 && (32 % kTpr) == 0, "row split");
};

inline bool head_dim_supported(uint32_t d) {
  return d == 32 || d == 64 || d == 128 || d == 256 || d == 512;
}

template <typename F>
bool dispatch_head_dim(uint32_t d, F&& f) {
  switch (d) {
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 256: f(std::integral_constant<int, 256>{}); return true;
    case 512: f(std::integral_constant<int, 512>{}); return true;
    default: return false;
  }
}

// Raises a kernel's dynamic shared memory limit to `bytes`, calling the runtime
// only the first time a (device, kernel) needs more: steady-state launches, also
// those recorded by CUDA graph capture, make no configuration calls.
cudaError_t ensure_dynamic_smem(const void* kernel, size_t bytes);

template <typename F>
bool dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return true;
    case DType::kF16: f(__half{}); return true;
    case DType::kBF16: f(__nv_bfloat16{}); return true;
    default: return false;
  }
}

}  // namespace ssa::cuda
