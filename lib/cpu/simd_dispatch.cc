#include <stdlib.h>
#include <string.h>

#include "simd.h"

namespace ssa::simd {

const Kernels& kernels() {
  static const Kernels* chosen = [] {
    const char* force = getenv("SSA_SIMD");
    if (force != nullptr && strcmp(force, "generic") == 0) return &generic_kernels();
    const Kernels* avx512 = avx512_kernels();
    if (avx512 != nullptr && (force == nullptr || strcmp(force, "avx2") != 0)) return avx512;
    const Kernels* avx2 = avx2_kernels();
    return avx2 != nullptr ? avx2 : &generic_kernels();
  }();
  return *chosen;
}

}  // namespace ssa::simd
