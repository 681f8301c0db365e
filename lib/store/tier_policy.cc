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

namespace {

// The host pages each layer keeps, `total` in all (at most the sum of `cap`),
// in proportion to the layers' sizes: t[l] = min(cap[l], floor(lambda size[l]))
// for the largest lambda whose sum fits, then the pages left one at a time to
// the layer whose share would stay the smallest (ties: the lowest layer).
std::vector<uint64_t> spread_over(const std::vector<uint64_t>& size, const std::vector<uint64_t>& cap,
                                  uint64_t total) {
  const size_t L = size.size();
  auto at = [&](double lambda, std::vector<uint64_t>* t) {
    uint64_t sum = 0;
    for (size_t l = 0; l < L; ++l) {
      const uint64_t v = std::min<uint64_t>(cap[l], static_cast<uint64_t>(lambda * static_cast<double>(size[l])));
      if (t != nullptr) (*t)[l] = v;
      sum += v;
    }
    return sum;
  };
  double lo = 0.0, hi = 1.0;  // a layer never keeps more than its size
  for (int i = 0; i < 64; ++i) {
    const double mid = (lo + hi) / 2;
    (at(mid, nullptr) <= total ? lo : hi) = mid;
  }
  std::vector<uint64_t> t(L);
  uint64_t sum = at(lo, &t);
  while (sum < total) {
    size_t best = L;
    for (size_t l = 0; l < L; ++l) {
      if (t[l] >= cap[l]) continue;
      // (t[l] + 1) / size[l] < (t[best] + 1) / size[best], in integers
      if (best == L || (t[l] + 1) * size[best] < (t[best] + 1) * size[l]) best = l;
    }
    if (best == L) break;  // every layer at its cap
    ++t[best];
    ++sum;
  }
  return t;
}

}  // namespace

BalancePlan plan_balance(const std::vector<std::vector<PagePlacement>>& pages, const std::vector<uint64_t>& n_tokens,
                         uint32_t page_tokens, uint64_t room) {
  const size_t L = pages.size();
  BalancePlan plan;
  plan.bring_in.assign(L, 0);
  std::vector<uint64_t> pinned_host(L, 0), loose_host(L, 0), size(L), cap(L);
  std::vector<std::vector<size_t>> movable(L);  // unpinned device pages
  uint64_t pinned_total = 0, loose_total = 0;
  for (size_t l = 0; l < L; ++l) {
    const std::vector<PagePlacement>& pl = pages[l];
    for (size_t i = 0; i < pl.size(); ++i) {
      if (pl[i].shared) continue;
      const bool pinned = pinned_to_device(i, n_tokens[l], page_tokens);
      if (pl[i].tier == PageTier::kHost) {
        ++(pinned ? pinned_host[l] : loose_host[l]);
      } else if (pl[i].tier == PageTier::kDevice && !pinned) {
        movable[l].push_back(i);
      }
    }
    pinned_total += pinned_host[l];
    loose_total += loose_host[l];
    size[l] = pl.size();
    cap[l] = loose_host[l] + movable[l].size();
  }
  // What stays on the host in all: everything beyond the room. Pinned pages
  // stay only where the unpinned ones cannot take their place.
  const uint64_t host_total = pinned_total + loose_total;
  const uint64_t stay = host_total - std::min(host_total, room);
  uint64_t cap_total = 0;
  for (size_t l = 0; l < L; ++l) cap_total += cap[l];
  if (stay > cap_total) {  // the pinned pages only, layer after layer, as far as the room goes
    uint64_t left = room;
    for (size_t l = 0; l < L; ++l) {
      plan.bring_in[l] = std::min(left, pinned_host[l]);
      left -= plan.bring_in[l];
    }
    return plan;
  }
  const std::vector<uint64_t> keep = spread_over(size, cap, stay);
  uint64_t give_total = 0;
  for (size_t l = 0; l < L; ++l) {
    plan.bring_in[l] = pinned_host[l] + (loose_host[l] > keep[l] ? loose_host[l] - keep[l] : 0);
    give_total += keep[l] > loose_host[l] ? keep[l] - loose_host[l] : 0;
  }
  if (give_total < L) return plan;  // bring_in stops where the room ends
  for (size_t l = 0; l < L; ++l) {
    if (keep[l] <= loose_host[l]) continue;
    // The least recently read first, then the oldest; sorted only this far.
    const std::vector<PagePlacement>& pl = pages[l];
    std::vector<size_t>& m = movable[l];
    const auto n = static_cast<ptrdiff_t>(keep[l] - loose_host[l]);
    std::partial_sort(m.begin(), m.begin() + n, m.end(), [&](size_t a, size_t b) {
      return pl[a].last_read != pl[b].last_read ? pl[a].last_read < pl[b].last_read : a < b;
    });
    for (ptrdiff_t k = 0; k < n; ++k) plan.give_up.push_back(LayerPage{static_cast<uint32_t>(l), m[static_cast<size_t>(k)]});
  }
  return plan;
}

}  // namespace ssa
