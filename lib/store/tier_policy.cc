#include "tier_policy.h"

#include <algorithm>

namespace ssa {

bool pinned_to_device(uint64_t index, uint64_t n_tokens, uint32_t page_tokens) {
  const uint64_t first = index * page_tokens, end = first + page_tokens;
  if (first < kDeviceHeadTokens) return true;
  return end > (n_tokens > kDeviceTailTokens ? n_tokens - kDeviceTailTokens : 0);
}

RebalancePlan plan_rebalance(const std::vector<PagePlacement>& pages, uint64_t n_tokens, uint32_t page_tokens,
                             uint64_t new_pages, uint64_t room) {
  RebalancePlan plan;
  std::vector<size_t> movable;
  for (size_t i = pages.size(); i-- > 0;) {
    const PagePlacement& p = pages[i];
    if (p.shared) continue;
    const bool pinned = pinned_to_device(i, n_tokens, page_tokens);
    if (pinned && p.tier == PageTier::kHost) plan.to_device.push_back(i);  // newest first
    if (!pinned && p.tier == PageTier::kDevice) movable.push_back(i);
  }
  const uint64_t wanted = plan.to_device.size() + new_pages;
  if (wanted <= room) return plan;
  std::sort(movable.begin(), movable.end(), [&](size_t a, size_t b) {
    if (pages[a].last_read != pages[b].last_read) return pages[a].last_read < pages[b].last_read;
    return a < b;
  });
  const uint64_t victims = std::min<uint64_t>(wanted - room, movable.size());
  plan.to_host.assign(movable.begin(), movable.begin() + static_cast<ptrdiff_t>(victims));
  return plan;
}

}  // namespace ssa
