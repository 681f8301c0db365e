// The host-side policies of tiered CUDA sessions (docs/TIERED_MEMORY.md), with
// no GPU: which pages stay on the device, which move first, which host pages
// the device cache admits and evicts, and the budget's accounting under
// concurrent charges. Each is checked against a reference written from the
// documented rule on random cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "store/budget_peers.h"
#include "store/device_budget.h"
#include "store/page_cache_policy.h"
#include "store/tier_policy.h"

namespace ssa {
namespace {

// Pinned: some token of the page is among the first 128 or the newest 1024.
bool pinned_reference(uint64_t page, uint64_t n, uint32_t P) {
  for (uint64_t t = page * P; t < (page + 1) * P; ++t) {
    if (t < kDeviceHeadTokens) return true;
    if (t < n && t + kDeviceTailTokens >= n) return true;
  }
  return false;
}

TEST_CASE("tier policy: the sink and the newest tokens are pinned to the device") {
  for (uint32_t P : {16u, 128u, 256u, 4096u}) {
    for (uint64_t n : {1ull, 100ull, 128ull, 129ull, 1024ull, 1500ull, 5000ull, 100000ull}) {
      const uint64_t pages = (n + P - 1) / P;
      for (uint64_t i = 0; i < pages; ++i) {
        INFO("P ", P, " n ", n, " page ", i);
        CHECK(pinned_to_device(i, n, P) == pinned_reference(i, n, P));
      }
    }
  }
  // 256-token pages of a 1M-token layer: the first page and the last four.
  const uint64_t n = 1 << 20;
  CHECK(pinned_to_device(0, n, 256));
  CHECK(!pinned_to_device(1, n, 256));
  CHECK(!pinned_to_device(n / 256 - 5, n, 256));
  CHECK(pinned_to_device(n / 256 - 4, n, 256));
}

TEST_CASE("tier policy: rebalancing brings pinned pages back and moves the least recently read out") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t P = 16u << (rng() % 4);
    const uint64_t n = 1 + rng() % 20000;
    const size_t pages = (n + P - 1) / P;
    std::vector<PagePlacement> pl(pages);
    for (auto& p : pl) {
      p.tier = rng() % 3 == 0 ? PageTier::kHost : PageTier::kDevice;
      p.shared = rng() % 7 == 0;
      p.last_read = rng() % 4 == 0 ? 0 : rng() % 50;
    }
    const uint64_t new_pages = rng() % 4, room = rng() % 12;
    const RebalancePlan plan = plan_rebalance(pl, n, P, new_pages, room);
    // Reference: every unshared pinned host page comes back, newest first.
    std::vector<size_t> back;
    for (size_t i = pages; i-- > 0;)
      if (!pl[i].shared && pl[i].tier == PageTier::kHost && pinned_reference(i, n, P)) back.push_back(i);
    CHECK(plan.to_device == back);
    // Victims: what the pinned pages and new pages need beyond the room, picked
    // one at a time as the least recently read (then lowest) movable device page.
    const uint64_t wanted = back.size() + new_pages;
    std::set<size_t> left;
    for (size_t i = 0; i < pages; ++i)
      if (!pl[i].shared && pl[i].tier == PageTier::kDevice && !pinned_reference(i, n, P)) left.insert(i);
    std::vector<size_t> victims;
    for (uint64_t v = 0; wanted > room && v < wanted - room && !left.empty(); ++v) {
      size_t best = *left.begin();
      for (size_t i : left)
        if (pl[i].last_read < pl[best].last_read) best = i;
      victims.push_back(best);
      left.erase(best);
    }
    INFO("trial ", trial);
    CHECK(plan.to_host == victims);
  }
}

TEST_CASE("tier policy: a session taking its turn brings its host pages in, pinned first, then most recently read") {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t P = 16u << (rng() % 4);
    const uint64_t n = 1 + rng() % 20000;
    const size_t pages = (n + P - 1) / P;
    std::vector<PagePlacement> pl(pages);
    for (auto& p : pl) {
      p.tier = rng() % 2 == 0 ? PageTier::kHost : PageTier::kDevice;
      p.shared = rng() % 7 == 0;
      p.last_read = rng() % 4 == 0 ? 0 : rng() % 30;
    }
    const std::vector<size_t> order = plan_bring_in(pl, n, P);
    // Reference: repeatedly the best remaining unshared host page, by (pinned,
    // last read, position), all highest first.
    std::set<size_t> left;
    for (size_t i = 0; i < pages; ++i)
      if (!pl[i].shared && pl[i].tier == PageTier::kHost) left.insert(i);
    std::vector<size_t> want;
    while (!left.empty()) {
      size_t best = *left.begin();
      for (size_t i : left) {
        const bool pi = pinned_reference(i, n, P), pb = pinned_reference(best, n, P);
        if (pi != pb ? pi : pl[i].last_read != pl[best].last_read ? pl[i].last_read > pl[best].last_read : i > best)
          best = i;
      }
      want.push_back(best);
      left.erase(best);
    }
    INFO("trial ", trial);
    CHECK(order == want);
  }
}

TEST_CASE("tier policy: an idle session gives up its least recently read movable device pages, over all layers") {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t P = 16u << (rng() % 3);
    const uint32_t layers = 1 + rng() % 4;
    std::vector<std::vector<PagePlacement>> pl(layers);
    std::vector<uint64_t> n(layers);
    for (uint32_t l = 0; l < layers; ++l) {
      n[l] = 1 + rng() % 6000;
      pl[l].resize((n[l] + P - 1) / P);
      for (auto& p : pl[l]) {
        p.tier = rng() % 3 == 0 ? PageTier::kHost : PageTier::kDevice;
        p.shared = rng() % 9 == 0;
        p.last_read = rng() % 3 == 0 ? 0 : rng() % 20;
      }
    }
    const uint64_t count = rng() % 40;
    const std::vector<LayerPage> got = plan_give_up(pl, n, P, count);
    // Reference: one at a time, the least recently read movable device page,
    // then the lowest position, then the lowest layer.
    std::vector<LayerPage> left;
    for (uint32_t l = 0; l < layers; ++l)
      for (size_t i = 0; i < pl[l].size(); ++i)
        if (!pl[l][i].shared && pl[l][i].tier == PageTier::kDevice && !pinned_reference(i, n[l], P))
          left.push_back({l, i});
    std::vector<LayerPage> want;
    while (want.size() < count && !left.empty()) {
      size_t best = 0;
      for (size_t k = 1; k < left.size(); ++k) {
        const LayerPage& a = left[k];
        const LayerPage& b = left[best];
        const uint64_t ra = pl[a.layer][a.page].last_read, rb = pl[b.layer][b.page].last_read;
        if (ra != rb ? ra < rb : a.page != b.page ? a.page < b.page : a.layer < b.layer) best = k;
      }
      want.push_back(left[best]);
      left.erase(left.begin() + static_cast<ptrdiff_t>(best));
    }
    INFO("trial ", trial);
    CHECK(got == want);
  }
}

// Host pages of layer l of a placement (unshared), pinned ones apart.
struct LayerCounts {
  uint64_t pinned_host = 0, loose_host = 0, movable = 0, size = 0;
};
LayerCounts counts_of(const std::vector<PagePlacement>& pl, uint64_t n, uint32_t P) {
  LayerCounts c;
  c.size = pl.size();
  for (size_t i = 0; i < pl.size(); ++i) {
    if (pl[i].shared) continue;
    const bool pinned = pinned_reference(i, n, P);
    if (pl[i].tier == PageTier::kHost) ++(pinned ? c.pinned_host : c.loose_host);
    else if (!pinned) ++c.movable;
  }
  return c;
}

TEST_CASE("tier policy: a session taking its turn spreads the host pages it keeps over its layers") {
  std::mt19937_64 rng(17);
  uint64_t with_give_ups = 0, without = 0, pinned_only = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t P = 16u << (rng() % 3);
    const uint32_t layers = 1 + rng() % 6;
    std::vector<std::vector<PagePlacement>> pl(layers);
    std::vector<uint64_t> n(layers);
    // 0: the last layers on the host, pinned pages too (a layer-major fill: a
    // layer with no device page has no victim for its pinned ones); 1: random; 2: spread
    const int shape = trial % 3;
    const uint32_t host_from = rng() % (layers + 1);
    for (uint32_t l = 0; l < layers; ++l) {
      n[l] = 200 + rng() % 6000;
      pl[l].resize((n[l] + P - 1) / P);
      for (size_t i = 0; i < pl[l].size(); ++i) {
        PagePlacement& p = pl[l][i];
        const bool host = shape == 0 ? l >= host_from
                          : shape == 1 ? rng() % 3 == 0
                                       : i % 4 == 1;
        p.tier = host ? PageTier::kHost : PageTier::kDevice;
        p.shared = rng() % 11 == 0;
        p.last_read = rng() % 3 == 0 ? 0 : rng() % 20;
      }
    }
    const uint64_t room = rng() % 3 == 0 ? 0 : rng() % 400;
    const BalancePlan plan = plan_balance(pl, n, P, room);
    INFO("trial ", trial, " layers ", layers, " room ", room);
    REQUIRE(plan.bring_in.size() == layers);
    std::vector<LayerCounts> c(layers);
    uint64_t pinned_total = 0, loose_total = 0;
    for (uint32_t l = 0; l < layers; ++l) {
      c[l] = counts_of(pl[l], n[l], P);
      pinned_total += c[l].pinned_host;
      loose_total += c[l].loose_host;
    }
    // Give-ups: movable device pages (unshared, unpinned), each once, and per
    // layer the least recently read first (then the oldest).
    std::set<std::pair<uint32_t, size_t>> seen;
    std::vector<std::vector<size_t>> given(layers);
    for (const LayerPage& g : plan.give_up) {
      REQUIRE(g.layer < layers);
      REQUIRE(g.page < pl[g.layer].size());
      const PagePlacement& p = pl[g.layer][g.page];
      CHECK(p.tier == PageTier::kDevice);
      CHECK(!p.shared);
      CHECK(!pinned_reference(g.page, n[g.layer], P));
      CHECK(seen.insert({g.layer, g.page}).second);
      given[g.layer].push_back(g.page);
    }
    for (uint32_t l = 0; l < layers; ++l) {
      for (size_t i = 0; i < pl[l].size(); ++i) {  // nothing left on the device is a better victim
        const PagePlacement& p = pl[l][i];
        if (p.shared || p.tier != PageTier::kDevice || pinned_reference(i, n[l], P) || seen.count({l, i})) continue;
        for (size_t g : given[l]) {
          const PagePlacement& q = pl[l][g];
          CHECK((q.last_read < p.last_read || (q.last_read == p.last_read && g < i)));
        }
      }
    }
    uint64_t cap_total = 0;
    for (uint32_t l = 0; l < layers; ++l) cap_total += c[l].loose_host + c[l].movable;
    const uint64_t fit = std::min(pinned_total + loose_total, room);
    if (pinned_total + loose_total - fit > cap_total) {  // no room for the pinned pages even after give-ups
      CHECK(plan.give_up.empty());
      uint64_t left = room;
      for (uint32_t l = 0; l < layers; ++l) {
        CHECK(plan.bring_in[l] == std::min(left, c[l].pinned_host));
        left -= std::min(left, c[l].pinned_host);
      }
      ++pinned_only;
      continue;
    }
    // What stays on the host after the turn, per layer (its unpinned pages).
    uint64_t brought = 0, stay_total = 0;
    std::vector<uint64_t> stay(layers);
    for (uint32_t l = 0; l < layers; ++l) {
      REQUIRE(plan.bring_in[l] >= c[l].pinned_host);  // pinned pages always come in
      REQUIRE(plan.bring_in[l] <= c[l].pinned_host + c[l].loose_host);
      brought += plan.bring_in[l];
      stay[l] = c[l].loose_host - (plan.bring_in[l] - c[l].pinned_host) + given[l].size();
      stay_total += stay[l];
    }
    // The room is used: everything comes in that fits, counting the give-ups.
    if (!plan.give_up.empty()) {
      ++with_give_ups;
      CHECK(brought == fit + plan.give_up.size());
      CHECK(plan.give_up.size() >= layers);
      // Spread: a layer keeps more than its share only where it could not give
      // more (every movable page given), and by at most one page's rounding.
      for (uint32_t a = 0; a < layers; ++a) {
        for (uint32_t b = 0; b < layers; ++b) {
          if (c[b].size == 0 || c[a].size == 0) continue;
          const bool b_full = stay[b] == c[b].loose_host + c[b].movable;
          if (b_full) continue;
          // stay[a] / size[a] <= (stay[b] + 1) / size[b]
          CHECK(stay[a] * c[b].size <= (stay[b] + 1) * c[a].size);
        }
      }
    } else {
      ++without;
      CHECK(brought >= fit);
      CHECK(brought < fit + layers);  // give-ups left out: under one page per layer
    }
  }
  MESSAGE("plans with give-ups ", with_give_ups, ", without ", without, ", pinned pages only ", pinned_only);
  CHECK(with_give_ups > 30);
  CHECK(without > 50);
  CHECK(pinned_only > 5);
}

TEST_CASE("tier policy: a layer-major fill's host layers are spread at the turn; once spread, nothing moves") {
  // Four layers of 256 pages of 16 tokens, the last one on the host, its pinned
  // pages too (as a fill layer after layer leaves it), no room: its pinned pages
  // come in and its 256 host pages are spread, 64 a layer.
  const uint32_t P = 16, layers = 4;
  const uint64_t n = 256 * P;
  std::vector<std::vector<PagePlacement>> pl(layers, std::vector<PagePlacement>(256));
  std::vector<uint64_t> ns(layers, n);
  uint64_t host = 0;
  for (size_t i = 0; i < 256; ++i) {
    pl[3][i].tier = PageTier::kHost;
    ++host;
  }
  BalancePlan plan = plan_balance(pl, ns, P, 0);
  CHECK(plan.bring_in[3] == 256 - 64);  // its 72 pinned pages among them
  std::vector<uint64_t> stays(layers, 0);
  stays[3] = host - plan.bring_in[3];
  for (const LayerPage& g : plan.give_up) ++stays[g.layer];
  for (uint32_t l = 0; l < layers; ++l) CHECK(stays[l] == 64);
  CHECK(stays[0] + stays[1] + stays[2] + stays[3] == host);
  // Never read: the oldest unpinned pages go first, from page 8 on (0-7 hold the sink).
  for (uint32_t l = 0; l < 3; ++l) {
    std::vector<size_t> got;
    for (const LayerPage& g : plan.give_up)
      if (g.layer == l) got.push_back(g.page);
    REQUIRE(!got.empty());
    for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == 8 + k);
  }
  // Applied, the plan leaves nothing to move.
  for (const LayerPage& g : plan.give_up) pl[g.layer][g.page].tier = PageTier::kHost;
  std::vector<size_t> order = plan_bring_in(pl[3], n, P);
  for (uint64_t k = 0; k < plan.bring_in[3]; ++k) pl[3][order[k]].tier = PageTier::kDevice;
  const BalancePlan again = plan_balance(pl, ns, P, 0);
  CHECK(again.give_up.empty());
  for (uint32_t l = 0; l < layers; ++l) CHECK(again.bring_in[l] <= 1);
  // Room for everything: all comes in, nothing is given up.
  const BalancePlan all = plan_balance(pl, ns, P, 4 * 256);
  CHECK(all.give_up.empty());
  for (uint32_t l = 0; l < layers; ++l) CHECK(all.bring_in[l] == stays[l]);
}

TEST_CASE("budget peers: the idle are visited least recently active first; never self, never one not yet active") {
  BudgetPeers peers;
  std::vector<ssa_session*> s;
  for (uintptr_t i = 1; i <= 5; ++i) s.push_back(reinterpret_cast<ssa_session*>(i * 64));  // identities only
  for (ssa_session* x : s) peers.join(x);
  auto visited = [&](ssa_session* self, size_t stop_after = 100) {
    std::vector<ssa_session*> v;
    peers.visit_idle(self, [&](ssa_session* t) {
      v.push_back(t);
      return v.size() >= stop_after;
    });
    return v;
  };
  CHECK(visited(s[0]).empty());  // none has been active: none can be a creation in progress
  for (int i : {3, 1, 4, 0}) peers.mark_active(s[i]);
  CHECK(visited(s[0]) == std::vector<ssa_session*>{s[3], s[1], s[4]});
  CHECK(visited(s[2]) == std::vector<ssa_session*>{s[3], s[1], s[4], s[0]});
  CHECK(visited(s[2], 2) == std::vector<ssa_session*>{s[3], s[1]});  // stops when the visitor has enough
  peers.mark_active(s[3]);
  peers.leave(s[1]);
  CHECK(visited(s[2]) == std::vector<ssa_session*>{s[4], s[0], s[3]});
  CHECK(peers.size() == 4);
  // leave() waits for a visit under way: a visitor never sees a session after it left.
  std::atomic<bool> inside{false}, left_done{false};
  std::thread visitor([&] {
    peers.visit_idle(s[2], [&](ssa_session*) {
      inside = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK(!left_done.load());
      return true;
    });
  });
  while (!inside.load()) std::this_thread::yield();
  peers.leave(s[4]);
  left_done = true;
  visitor.join();
  CHECK(peers.size() == 3);
}

// The documented cache rule, written as a plain simulation.
struct CacheReference {
  size_t capacity;
  std::map<uint64_t, uint64_t> last;  // cached page -> last read
  PageCachePolicy::Update observe(const std::vector<PageCachePolicy::PageReads>& reads, uint64_t step,
                                  size_t max_admit) {
    PageCachePolicy::Update u;
    std::vector<PageCachePolicy::PageReads> misses;
    for (const auto& r : reads) {
      if (last.count(r.page)) last[r.page] = step;
      else if (r.rows > 0) misses.push_back(r);
    }
    std::stable_sort(misses.begin(), misses.end(),
                     [](const auto& a, const auto& b) { return a.rows > b.rows || (a.rows == b.rows && a.page < b.page); });
    for (const auto& m : misses) {
      if (u.admit.size() >= max_admit || capacity == 0) break;
      if (last.size() >= capacity) {
        // Least recently read before this step, lowest page on ties.
        bool found = false;
        std::pair<uint64_t, uint64_t> best{};
        for (const auto& [page, l] : last) {
          if (l >= step) continue;
          if (!found || l < best.first || (l == best.first && page < best.second)) best = {l, page};
          found = true;
        }
        if (!found) break;
        last.erase(best.second);
        u.evict.push_back(best.second);
      }
      last[m.page] = step;
      u.admit.push_back(m.page);
    }
    return u;
  }
};

TEST_CASE("page cache policy: admits the most-read misses, evicts the least recently read") {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t cap = rng() % 12, max_admit = 1 + rng() % 5;
    PageCachePolicy pol(cap);
    CacheReference ref{cap, {}};
    for (uint64_t step = 1; step <= 200; ++step) {
      // A hot set that drifts, plus scattered single reads.
      std::map<uint64_t, uint32_t> rows;
      const uint64_t base = step / 10;
      for (int i = 0; i < 6; ++i) rows[base + rng() % 8] += 1 + rng() % 5;
      for (int i = 0; i < 4; ++i) rows[rng() % 300] += 1;
      std::vector<PageCachePolicy::PageReads> reads;
      for (const auto& [p, r] : rows) reads.push_back({p, r});
      std::shuffle(reads.begin(), reads.end(), rng);
      const auto got = pol.observe(reads, step, max_admit);
      const auto want = ref.observe(reads, step, max_admit);
      INFO("trial ", trial, " step ", step);
      REQUIRE(got.admit == want.admit);
      REQUIRE(got.evict == want.evict);
      CHECK(pol.size() <= cap);
      CHECK(pol.size() == ref.last.size());
      // Forgetting (a failed copy, a page that changed) frees the slot.
      if (!got.admit.empty() && rng() % 10 == 0) {
        pol.forget(got.admit.back());
        ref.last.erase(got.admit.back());
        CHECK(!pol.cached(got.admit.back()));
      }
    }
  }
}

TEST_CASE("device budget: concurrent charges never exceed either account") {
  DeviceBudget b(1000, 200);
  CHECK(b.limited());
  CHECK(b.limit(DeviceBudget::kResident) == 800);
  CHECK(b.limit(DeviceBudget::kCache) == 200);
  CHECK(!b.try_charge(DeviceBudget::kCache, 201));
  std::vector<std::thread> ts;
  std::atomic<uint64_t> peak{0};
  std::atomic<bool> cache_over{false};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 20000; ++i) {
        const uint64_t bytes = 1 + rng() % 100;
        const auto acct = i % 3 == 0 ? DeviceBudget::kCache : DeviceBudget::kResident;
        if (b.try_charge(acct, bytes)) {
          const uint64_t u = b.used(DeviceBudget::kResident);
          uint64_t p = peak.load();
          while (u > p && !peak.compare_exchange_weak(p, u)) {
          }
          if (b.used(DeviceBudget::kCache) > 200) cache_over = true;
          b.release(acct, bytes);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(!cache_over.load());
  CHECK(peak.load() <= 800);
  CHECK(peak.load() > 0);
  CHECK(b.used(DeviceBudget::kResident) == 0);
  CHECK(b.used(DeviceBudget::kCache) == 0);
  DeviceBudget none(0, 0);
  CHECK(!none.limited());
  CHECK(none.try_charge(DeviceBudget::kResident, uint64_t{1} << 50));
}

}  // namespace
}  // namespace ssa
