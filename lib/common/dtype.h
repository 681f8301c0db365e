// Storage dtypes and exact scalar conversions to and from float. The CPU backend's
// vectorised paths (cpu/simd_*.cc) must agree with these bit for bit.
#pragma once

#include <stdint.h>
#include <string.h>

#include "host_device.h"

namespace ssa {

enum class DType : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

SSA_HD uint32_t dtype_bytes(DType t) { return t == DType::kF32 ? 4u : 2u; }

SSA_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
SSA_HD uint32_t bits_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

SSA_HD float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
SSA_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

SSA_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, overflow to infinity, NaN stays NaN.
SSA_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_from_f32(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (au >= 0x477ff000u) return sign | 0x7c00u;         // >= 65520 rounds to inf
  if (au < 0x38800000u) {                               // below smallest normal 2^-14
    if (au < 0x33000000u) return sign;                  // < 2^-25 rounds to 0
    const uint32_t e = au >> 23;
    const uint32_t m = (au & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;                    // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = au - 0x38000000u;                        // rebias exponent 127 -> 15
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return sign | static_cast<uint16_t>(r);
}

SSA_HD float load_as_f32(const void* base, DType t, uint64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
}

SSA_HD void store_from_f32(void* base, DType t, uint64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    default: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
  }
}

}  // namespace ssa
