#include "group_proposal.h"

#include <math.h>

#include <algorithm>
#include <vector>

#include "fixed_point_sampler.h"

namespace ssa {

uint64_t proposal_total(const float* s, size_t n, float mx) {
  thread_local std::vector<float> e;
  e.resize(n);
  proposal_weights(s, n, mx, e.data());
  return fixed_sum(e.data(), n);
}

void mixture_logits(const float* const* scores, uint32_t g, size_t n, const float* head_max,
                    const uint64_t* head_total, float* out) {
  if (g == 1) {
    std::copy(scores[0], scores[0] + n, out);
    return;
  }
  // softmax_j(t) = exp(s_j(t) - max_j) / Z_j: one exp per head and token; the
  // mixture's weight is the sum of those over j and its logit that sum's log. A
  // token whose every term underflows keeps the largest log term (within log g
  // of the exact value) instead of -inf.
  thread_local std::vector<float> w, shift;
  w.resize(size_t{g} * n);
  shift.resize(g);
  std::vector<float> inv_z(g);
  for (uint32_t j = 0; j < g; ++j) {
    const double z = fixed_to_double(head_total[j]);
    proposal_weights(scores[j], n, head_max[j], w.data() + j * n);
    inv_z[j] = static_cast<float>(1.0 / z);
    shift[j] = head_max[j] + static_cast<float>(log(z));
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
