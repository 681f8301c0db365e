#include "radix_topk.h"

#include <algorithm>

namespace ssa {

void topk_indices(const float* x, size_t n, size_t k, uint32_t base, std::vector<uint32_t>* out) {
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) out->push_back(base + static_cast<uint32_t>(i));
    return;
  }
  // Pass 1: histogram of the top 12 key bits.
  constexpr int kBits = 12, kShift = 32 - kBits;
  std::vector<uint32_t> hist(size_t{1} << kBits, 0);
  for (size_t i = 0; i < n; ++i) ++hist[float_order_key(x[i]) >> kShift];
  // Find the threshold bin from the top.
  size_t above = 0;
  uint32_t bin = (1u << kBits) - 1;
  for (;; --bin) {
    if (above + hist[bin] >= k) break;
    above += hist[bin];
  }
  // Pass 2: take every element of higher bins, collect the threshold bin.
  std::vector<std::pair<uint32_t, uint32_t>> border;  // (key, index)
  border.reserve(hist[bin]);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = float_order_key(x[i]);
    const uint32_t b = key >> kShift;
    if (b > bin) {
      out->push_back(base + static_cast<uint32_t>(i));
    } else if (b == bin) {
      border.emplace_back(key, static_cast<uint32_t>(i));
    }
  }
  const size_t need = k - above;
  auto larger = [](const std::pair<uint32_t, uint32_t>& a, const std::pair<uint32_t, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::nth_element(border.begin(), border.begin() + (need - 1), border.end(), larger);
  for (size_t i = 0; i < need; ++i) out->push_back(base + border[i].second);
}

}  // namespace ssa
