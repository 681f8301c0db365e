#include "tier_policy.h"

#include <algorithm>
#include <tuple>

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

std::vector<size_t> plan_bring_in(const std::vector<PagePlacement>& pages, uint64_t n_tokens, uint32_t page_tokens) {
  std::vector<size_t> order;
  for (size_t i = 0; i < pages.size(); ++i)
    if (!pages[i].shared && pages[i].tier == PageTier::kHost) order.push_back(i);
  auto key = [&](size_t i) { return std::make_tuple(pinned_to_device(i, n_tokens, page_tokens), pages[i].last_read, i); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  return order;
}

std::vector<LayerPage> plan_give_up(const std::vector<std::vector<PagePlacement>>& pages,
                                    const std::vector<uint64_t>& n_tokens, uint32_t page_tokens, uint64_t count) {
  std::vector<std::pair<uint64_t, LayerPage>> movable;  // (last read, page)
  for (uint32_t l = 0; l < pages.size(); ++l) {
    for (size_t i = 0; i < pages[l].size(); ++i) {
      const PagePlacement& p = pages[l][i];
      if (p.shared || p.tier != PageTier::kDevice || pinned_to_device(i, n_tokens[l], page_tokens)) continue;
      movable.push_back({p.last_read, LayerPage{l, i}});
    }
  }
  auto before = [](const std::pair<uint64_t, LayerPage>& a, const std::pair<uint64_t, LayerPage>& b) {
    return std::make_tuple(a.first, a.second.page, a.second.layer) < std::make_tuple(b.first, b.second.page, b.second.layer);
  };
  const size_t n = static_cast<size_t>(std::min<uint64_t>(count, movable.size()));
  std::partial_sort(movable.begin(), movable.begin() + static_cast<ptrdiff_t>(n), movable.end(), before);
  std::vector<LayerPage> out;
  for (size_t k = 0; k < n; ++k) out.push_back(movable[k].second);
  return out;
}

}  // namespace ssa
