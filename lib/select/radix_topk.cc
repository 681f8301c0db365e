#include "radix_topk.h"

#include <algorithm>
#include <functional>

namespace ssa {

void topk_indices(const float* x, size_t n, size_t k, uint32_t base, std::vector<uint32_t>* out) {
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) out->push_back(base + static_cast<uint32_t>(i));
    return;
  }
  // The threshold bin: the top 12 key bits of the k-th largest key, and how many
  // keys lie in higher bins.
  constexpr int kBits = 12, kShift = 32 - kBits;
  constexpr size_t kBins = size_t{1} << kBits;
  uint32_t bin = 0;
  size_t above = 0, in_bin = 0;
  if (n < kBins) {
    // Fewer keys than bins: the k-th largest of their bins directly, in O(n)
    // (a histogram's fixed cost would dominate, and calls with few candidates
    // come by the million).
    std::vector<uint32_t> bins(n);
    for (size_t i = 0; i < n; ++i) bins[i] = float_order_key(x[i]) >> kShift;
    std::nth_element(bins.begin(), bins.begin() + static_cast<ptrdiff_t>(k - 1), bins.end(), std::greater<>());
    bin = bins[k - 1];
    for (size_t i = 0; i < n; ++i) {
      const uint32_t b = float_order_key(x[i]) >> kShift;
      above += b > bin;
      in_bin += b == bin;
    }
  } else {
    // A histogram. Long rows count into four copies in turn: scores crowd into
    // few bins, and consecutive increments of one counter would wait on each
    // other's stores.
    const size_t copies = n >= 16 * kBins ? 4 : 1;
    std::vector<uint32_t> hist(copies * kBins, 0);
    size_t i0 = 0;
    if (copies == 4) {
      for (; i0 + 4 <= n; i0 += 4) {
        ++hist[float_order_key(x[i0]) >> kShift];
        ++hist[kBins + (float_order_key(x[i0 + 1]) >> kShift)];
        ++hist[2 * kBins + (float_order_key(x[i0 + 2]) >> kShift)];
        ++hist[3 * kBins + (float_order_key(x[i0 + 3]) >> kShift)];
      }
      for (size_t b = 0; b < kBins; ++b) hist[b] += hist[kBins + b] + hist[2 * kBins + b] + hist[3 * kBins + b];
    }
    for (; i0 < n; ++i0) ++hist[float_order_key(x[i0]) >> kShift];
    // From the top bin down, to the one that holds the k-th largest key.
    bin = kBins - 1;
    for (;; --bin) {
      if (above + hist[bin] >= k) break;
      above += hist[bin];
    }
    in_bin = hist[bin];
  }
  // Pass 2: take every element of higher bins, collect the threshold bin.
  std::vector<std::pair<uint32_t, uint32_t>> border;  // (key, index)
  border.reserve(in_bin);
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
