#include "finite_check.h"

namespace ssa {
namespace {

template <typename U>
size_t scan(const U* p, size_t n, U exp_mask) {
  // Branch-free over blocks so the compiler vectorises the common all-finite case.
  constexpr size_t kBlock = 256;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    bool bad = false;
    for (size_t i = b; i < e; ++i) bad |= (p[i] & exp_mask) == exp_mask;
    if (bad) {
      for (size_t i = b; i < e; ++i) {
        if ((p[i] & exp_mask) == exp_mask) return i;
      }
    }
  }
  return n;
}

}  // namespace

size_t first_non_finite(DType t, const void* data, size_t n) {
  switch (t) {
    case DType::kF32: return scan(static_cast<const uint32_t*>(data), n, uint32_t{0x7f800000u});
    case DType::kF16: return scan(static_cast<const uint16_t*>(data), n, uint16_t{0x7c00u});
    default: return scan(static_cast<const uint16_t*>(data), n, uint16_t{0x7f80u});
  }
}

}  // namespace ssa
