#include "key_weights.h"

#include <math.h>

#include <algorithm>
#include <vector>

namespace ssa {

void heavy_key_weights(const float* x, size_t n, uint32_t d, const float* q, uint32_t m, float* w) {
  if (n == 0) return;
  // Queries transposed, [d][m]: a key's m scores accumulate side by side (no
  // chain of dependent additions), each in dimension order.
  std::vector<float> qt(size_t{d} * m);
  for (uint32_t j = 0; j < m; ++j)
    for (uint32_t k = 0; k < d; ++k) qt[size_t{k} * m + j] = q[size_t{j} * d + k];
  std::vector<float> scores(n * m);  // [n][m]
  for (size_t i = 0; i < n; ++i) {
    float* s = scores.data() + i * m;
    std::fill(s, s + m, 0.0f);
    for (uint32_t k = 0; k < d; ++k) {
      const float xk = x[i * d + k];
      const float* col = qt.data() + size_t{k} * m;
      for (uint32_t j = 0; j < m; ++j) s[j] += xk * col[j];
    }
  }
  const size_t top = std::min<size_t>(n, static_cast<size_t>(ceil(kHeavyKeyFraction * static_cast<double>(n))));
  std::vector<uint32_t> hits(n, 0);
  std::vector<float> column(n);
  for (uint32_t j = 0; j < m; ++j) {
    for (size_t i = 0; i < n; ++i) column[i] = scores[i * m + j];
    std::nth_element(column.begin(), column.begin() + (top - 1), column.end(), std::greater<float>());
    const float threshold = column[top - 1];  // the top-th highest score
    for (size_t i = 0; i < n; ++i) hits[i] += scores[i * m + j] >= threshold ? 1u : 0u;
  }
  for (size_t i = 0; i < n; ++i) w[i] = 1.0f + kHeavyKeyBoost * static_cast<float>(hits[i]) / static_cast<float>(m);
}

}  // namespace ssa
