#include "group_proposal.h"

#include <math.h>

#include <algorithm>
#include <vector>

#include "common/sampling_hierarchy.h"
#include "cpu/simd.h"

namespace ssa {

void mixture_logits(const float* const* scores, uint32_t g, size_t n, float* out) {
  if (g == 1) {
    std::copy(scores[0], scores[0] + n, out);
    return;
  }
  // softmax_j(t) = exp(s_j(t) - max_j) / Z_j: one exp per head and token, whose
  // sum gives Z_j; the mixture's weight is the sum of those over j and its logit
  // that sum's log. A token whose every term underflows keeps the largest log
  // term (within log g of the exact value) instead of -inf.
  const auto& kern = simd::kernels();
  thread_local std::vector<float> w, shift;
  thread_local std::vector<double> block_sums;
  w.resize(size_t{g} * n);
  shift.resize(g);
  block_sums.resize((n + kBlockTokens - 1) / kBlockTokens);
  std::vector<float> inv_z(g);
  for (uint32_t j = 0; j < g; ++j) {
    const float mx = kern.max_value(scores[j], n);
    const double z = kern.exp_shifted(scores[j], mx, w.data() + j * n, n, block_sums.data());
    inv_z[j] = static_cast<float>(1.0 / z);
    shift[j] = mx + static_cast<float>(log(z));
  }
  for (size_t t = 0; t < n; ++t) {
    float sum = 0.0f;
    for (uint32_t j = 0; j < g; ++j) sum += w[j * n + t] * inv_z[j];
    if (sum > 0.0f) {
      out[t] = logf(sum);
    } else {
      float top = -INFINITY;
      for (uint32_t j = 0; j < g; ++j) top = std::max(top, scores[j][t] - shift[j]);
      out[t] = top;
    }
  }
}

void mean_query(const float* q, uint32_t g, uint32_t d, float* out) {
  for (uint32_t i = 0; i < d; ++i) {
    float s = 0.0f;
    for (uint32_t j = 0; j < g; ++j) s += q[size_t{j} * d + i];
    out[i] = s / static_cast<float>(g);
  }
}

}  // namespace ssa
