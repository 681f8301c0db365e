#include "budget_trade.h"

#include <algorithm>
#include <map>
#include <vector>

#include "device_error.h"
#include "device_state.h"
#include "device_tiers.h"
#include "session.h"
#include "store/tier_policy.h"

namespace ssa::cuda {
namespace {

// Per layer, the host pages `s` would bring in, in order (plan_bring_in). Its
// pages do not change until it brings them in: it is held exclusively, and its
// peers giving up theirs leave its own alone.
std::vector<std::vector<size_t>> bring_in_orders(ssa_session& s) {
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  std::vector<std::vector<size_t>> orders(s.layout.n_layers);
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    LayerTiers& lt = layer_tiers(st, l, s.layout.n_layers);
    orders[l] = plan_bring_in(placement_of(s, l, lt), s.layers[l].n_tokens, s.layout.page_tokens);
  }
  return orders;
}

// Moves up to `count` of idle peer `t`'s movable device pages to its host tier
// (t held exclusively by the caller). Its queued decodes are waited for and its
// tables dropped first, so the pages' device memory and charges go back at
// once; its next decode builds its tables again. Its cached copies go too:
// the reserving session may need the cache account. Adds the pages moved to *moved.
absl::Status give_up(ssa_session& t, uint64_t count, uint64_t* moved) {
  SessionState& st = state(t);
  if (!st.kv_pool->tiered() || st.steps_reserved.load()) return absl::OkStatus();  // its steps read its tables
  TieredKvPool& pool = *st.kv_pool;
  absl::MutexLock lock(&st.mu);
  st.drop_tables();
  const uint32_t n_layers = t.layout.n_layers;
  std::vector<std::vector<PagePlacement>> placement(n_layers);
  std::vector<uint64_t> n_tokens(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    LayerTiers& lt = layer_tiers(st, l, n_layers);
    drop_copies(lt, 0);
    placement[l] = placement_of(t, l, lt);
    n_tokens[l] = t.layers[l].n_tokens;
  }
  std::map<uint32_t, std::vector<std::pair<size_t, PageRef>>> moves;  // by layer
  for (const LayerPage& p : plan_give_up(placement, n_tokens, t.layout.page_tokens, count)) {
    const PageRef& page = t.layers[p.layer].kv_pages[p.page];
    if (PageRef backed = take_backing(*st.tiers[p.layer], p.page, page)) {  // the same bytes on the host: no copy
      replace_page(t, p.layer, p.page, std::move(backed));
      ++*moved;
      continue;
    }
    absl::StatusOr<PageRef> host = pool.host_page();
    if (!host.ok()) break;  // no host memory: the rest stay
    moves[p.layer].emplace_back(p.page, *std::move(host));
  }
  for (auto& [l, m] : moves) {
    const size_t n = m.size();
    SSA_RETURN_IF_ERROR(move_pages(t, l, m, pool.page_bytes(), "page move to an idle session's host tier"));
    *moved += n;
  }
  return absl::OkStatus();
}

// Brings layer l's host pages of `s` to the device, in `order`, while the
// budget has room beyond `keep` pages (the reservation's new pages, allocated after).
absl::Status bring_in(ssa_session& s, uint32_t l, const std::vector<size_t>& order, uint64_t keep) {
  SessionState& st = state(s);
  TieredKvPool& pool = *st.kv_pool;
  LayerStore& layer = s.layers[l];
  std::vector<std::pair<size_t, PageRef>> moves;
  absl::MutexLock lock(&st.mu);
  LayerTiers& lt = layer_tiers(st, l, s.layout.n_layers);
  for (size_t i : order) {
    if (pool.resident_room() <= keep) break;
    // Not zeroed: move_pages overwrites the whole page.
    absl::StatusOr<PageRef> dev = pool.device_page(DeviceBudget::kResident, false);
    if (!dev.ok()) return dev.status();
    if (*dev == nullptr) break;  // the budget is full
    moves.emplace_back(i, *std::move(dev));
  }
  // Each page keeps its host page while it stays unwritten (an append or a
  // reservation drops the backing of the pages it writes); cached copies of the
  // pages moved are dropped by the next table build (their host address is no
  // longer the layer's).
  std::vector<std::pair<size_t, LayerTiers::Backing>> kept;
  for (const auto& [i, dev] : moves) kept.push_back({i, {layer.kv_pages[i], dev}});
  SSA_RETURN_IF_ERROR(move_pages(s, l, moves, pool.page_bytes(), "page move to the device"));
  for (auto& [i, b] : kept) lt.backing[i] = std::move(b);
  return absl::OkStatus();
}

}  // namespace

absl::Status take_turn(ssa_session& s, uint64_t n_tokens) {
  SessionState& st = state(s);
  if (!st.kv_pool->tiered() || s.rt->budget_peers == nullptr) return absl::OkStatus();
  BudgetPeers& peers = *s.rt->budget_peers;
  peers.mark_active(&s);
  const std::vector<std::vector<size_t>> orders = bring_in_orders(s);
  uint64_t host_pages = 0;
  for (const std::vector<size_t>& o : orders) host_pages += o.size();
  uint64_t new_pages = 0;  // the reservation's, allocated by reserve_layer after this
  for (const LayerStore& layer : s.layers) {
    new_pages += s.layout.pages_for(layer.n_tokens + n_tokens) - s.layout.pages_for(layer.n_tokens);
    // The partly filled last page is copied first when anything else holds it (a
    // fork, the snapshot record after a checkpoint: lib/store/copy_on_write.h).
    if (layer.n_tokens % s.layout.page_tokens != 0 && layer.kv_pages.back().use_count() > 1) ++new_pages;
  }
  const uint64_t wanted = host_pages + new_pages;
  if (wanted == 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&st.mu);
    st.prune_retired();  // charges of tables no queued decode reads
  }
  const uint64_t room = st.kv_pool->resident_room();
  if (wanted > room) {
    uint64_t moved = 0;
    absl::Status status = absl::OkStatus();
    peers.visit_idle(&s, [&](ssa_session* t) {
      if (!t->mu.try_lock()) return false;  // busy: not idle
      status = give_up(*t, wanted - room - moved, &moved);
      t->mu.unlock();
      return !status.ok() || moved >= wanted - room;
    });
    SSA_RETURN_IF_ERROR(status);
  }
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) SSA_RETURN_IF_ERROR(bring_in(s, l, orders[l], new_pages));
  return absl::OkStatus();
}

}  // namespace ssa::cuda
