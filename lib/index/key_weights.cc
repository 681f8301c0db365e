#include "key_weights.h"

#include <math.h>

#include <algorithm>
#include <vector>

namespace ssa {

std::vector<float> transposed_queries(const float* q, uint32_t m, uint32_t d) {
  std::vector<float> qt(size_t{d} * m);
  for (uint32_t j = 0; j < m; ++j)
    for (uint32_t k = 0; k < d; ++k) qt[size_t{k} * m + j] = q[size_t{j} * d + k];
  return qt;
}

void key_query_scores(const float* x, size_t i0, size_t i1, uint32_t d, const float* qt, uint32_t m,
                      float* scores) {
  // A key's m scores accumulate side by side (no chain of dependent additions),
  // each in dimension order.
  for (size_t i = i0; i < i1; ++i) {
    float* s = scores + i * m;
    std::fill(s, s + m, 0.0f);
    for (uint32_t k = 0; k < d; ++k) {
      const float xk = x[i * d + k];
      const float* col = qt + size_t{k} * m;
      for (uint32_t j = 0; j < m; ++j) s[j] += xk * col[j];
    }
  }
}

size_t heavy_key_count(size_t n) {
  return std::min<size_t>(n, static_cast<size_t>(ceil(kHeavyKeyFraction * static_cast<double>(n))));
}

float heavy_threshold(const float* scores, size_t n, uint32_t m, uint32_t j, std::vector<float>& column) {
  column.resize(n);
  for (size_t i = 0; i < n; ++i) column[i] = scores[i * m + j];
  const size_t top = heavy_key_count(n);
  std::nth_element(column.begin(), column.begin() + (top - 1), column.end(), std::greater<float>());
  return column[top - 1];  // the top-th highest score
}

void weights_from_thresholds(const float* scores, size_t i0, size_t i1, uint32_t m, const float* thresholds,
                             float* w) {
  for (size_t i = i0; i < i1; ++i) {
    uint32_t hits = 0;
    for (uint32_t j = 0; j < m; ++j) hits += scores[i * m + j] >= thresholds[j] ? 1u : 0u;
    w[i] = 1.0f + kHeavyKeyBoost * static_cast<float>(hits) / static_cast<float>(m);
  }
}

void heavy_key_weights(const float* x, size_t n, uint32_t d, const float* q, uint32_t m, float* w) {
  if (n == 0) return;
  const std::vector<float> qt = transposed_queries(q, m, d);
  std::vector<float> scores(n * m), thresholds(m), column;  // scores [n][m]
  key_query_scores(x, 0, n, d, qt.data(), m, scores.data());
  for (uint32_t j = 0; j < m; ++j) thresholds[j] = heavy_threshold(scores.data(), n, m, j, column);
  weights_from_thresholds(scores.data(), 0, n, m, thresholds.data(), w);
}

}  // namespace ssa
