#include "quantized_lut.h"

#include <math.h>
#include <string.h>

#include <algorithm>

namespace ssa {

QuantizedLut quantize_lut(const float* lut, uint32_t M, uint32_t K, uint8_t* out) {
  memset(out, 0, size_t{M} * 16);
  double bias = 0.0, span = 0.0;
  for (uint32_t m = 0; m < M; ++m) {
    const float* l = lut + size_t{m} * K;
    const float lo = *std::min_element(l, l + K), hi = *std::max_element(l, l + K);
    bias += lo;
    span = std::max(span, double{hi} - double{lo});
  }
  QuantizedLut q;
  q.bias = static_cast<float>(bias);
  if (!(span > 0.0) || !isfinite(span)) return q;
  const double inv = 255.0 / span;
  for (uint32_t m = 0; m < M; ++m) {
    const float* l = lut + size_t{m} * K;
    const double lo = *std::min_element(l, l + K);
    for (uint32_t c = 0; c < K; ++c) {
      const double v = floor((double{l[c]} - lo) * inv + 0.5);
      out[size_t{m} * 16 + c] = static_cast<uint8_t>(std::min(255.0, std::max(0.0, v)));
    }
  }
  q.scale = static_cast<float>(span / 255.0);
  return q;
}

}  // namespace ssa
