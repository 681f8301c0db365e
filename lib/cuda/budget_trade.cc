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

// The placement of every layer's pages (st.mu held): the tier policy's input.
std::vector<std::vector<PagePlacement>> layer_placements(ssa_session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state(s).mu) {
  SessionState& st = state(s);
  const uint32_t n_layers = s.layout.n_layers;
  std::vector<std::vector<PagePlacement>> placement(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) placement[l] = placement_of(s, l, layer_tiers(st, l, n_layers));
  return placement;
}

std::vector<uint64_t> layer_lengths(const ssa_session& s) {
  std::vector<uint64_t> n;
  for (const LayerStore& layer : s.layers) n.push_back(layer.n_tokens);
  return n;
}

// A turn of `s` as make_room leaves it: its layers' placements and, per layer,
// the host pages it would bring in, in order (plan_bring_in); the reservation's
// new pages. Its pages do not change until it brings them in: it is held
// exclusively, and its peers giving up theirs leave its own alone.
struct Turn {
  std::vector<std::vector<PagePlacement>> placement;
  std::vector<std::vector<size_t>> orders;
  uint64_t new_pages = 0;
};

// Waits for the copies of a turn started ahead to land; after a device error
// they are forgotten.
absl::Status wait_incoming(SessionState& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  const cudaError_t e = cudaEventSynchronize(st.moves_done);
  if (e != cudaSuccess) st.incoming.clear();
  SSA_CUDA_RETURN(e, "waiting for a prefetch's page copies");
  return absl::OkStatus();
}

// Waits for the copies of a turn started ahead, then forgets them (their blocks
// go back to the pool).
absl::Status drop_incoming(SessionState& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  if (st.incoming.empty()) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(wait_incoming(st));
  st.incoming.clear();
  return absl::OkStatus();
}

// Device blocks for the pages of `order`, in order, while the budget has room
// beyond `keep` pages. Not zeroed: the copy into each overwrites the whole page.
absl::StatusOr<std::vector<std::pair<size_t, PageRef>>> claim_blocks(TieredKvPool& pool,
                                                                     const std::vector<size_t>& order,
                                                                     uint64_t keep) {
  std::vector<std::pair<size_t, PageRef>> blocks;
  for (size_t i : order) {
    if (pool.resident_room() <= keep) break;
    absl::StatusOr<PageRef> dev = pool.device_page(DeviceBudget::kResident, false);
    if (!dev.ok()) return dev.status();
    if (*dev == nullptr) break;  // the budget is full
    blocks.emplace_back(i, *std::move(dev));
  }
  return blocks;
}

// Takes in the pages of a turn started ahead whose copies have landed: each
// becomes the layer's page where the layer still holds the host page it was
// copied from, unshared (keeping that host page, as bring_in does).
absl::Status take_incoming(ssa_session& s) {
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  if (st.incoming.empty()) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(wait_incoming(st));
  for (SessionState::IncomingPage& p : st.incoming) {
    LayerStore& layer = s.layers[p.layer];
    if (p.index >= layer.kv_pages.size() || layer.kv_pages[p.index] != p.host) continue;
    p.host.reset();
    if (!page_movable(s, p.layer, p.index)) continue;  // shared since (a fork)
    LayerTiers& lt = layer_tiers(st, p.layer, s.layout.n_layers);
    lt.backing[p.index] = {layer.kv_pages[p.index], p.dev};
    replace_page(s, p.layer, p.index, std::move(p.dev));
  }
  st.incoming.clear();
  return absl::OkStatus();
}

// Queues the copies of st.incoming on the session's move stream, after the
// legacy default stream's work so far (where blocks are allocated and zeroed).
// Copy engines, not a kernel: the copies run beside other sessions' decodes.
cudaError_t queue_incoming(SessionState& st, size_t page_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  cudaError_t e = cudaSuccess;
  if (st.move_stream == nullptr) {
    e = cudaStreamCreateWithFlags(&st.move_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&st.moves_order, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&st.moves_done, cudaEventDisableTiming);
    if (e != cudaSuccess) return e;
  }
  if ((e = cudaEventRecord(st.moves_order, nullptr)) != cudaSuccess) return e;
  if ((e = cudaStreamWaitEvent(st.move_stream, st.moves_order, 0)) != cudaSuccess) return e;
  std::vector<void*> dst;
  std::vector<const void*> src;
  for (const SessionState::IncomingPage& p : st.incoming) {
    dst.push_back(p.dev->mutable_data());
    src.push_back(p.host->data());
  }
  const std::vector<size_t> sizes(dst.size(), page_bytes);
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
  e = cudaMemcpyBatchAsync(dst.data(), src.data(), sizes.data(), dst.size(), &attr, &attr_index, 1,
                           st.move_stream);
  if (e != cudaSuccess) {  // a driver without batched copies: one call per page
    cudaGetLastError();
    e = cudaSuccess;
    for (size_t i = 0; i < dst.size() && e == cudaSuccess; ++i)
      e = cudaMemcpyAsync(dst[i], src[i], page_bytes, cudaMemcpyHostToDevice, st.move_stream);
  }
  const cudaError_t recorded = cudaEventRecord(st.moves_done, st.move_stream);
  return e != cudaSuccess ? e : recorded;
}

// Drops `t`'s cached views of its pages (t->mu and st.mu held): a turn it
// started ahead (its blocks go back once its copies have landed), its tables
// (its queued decodes are waited for first) and its cached copies, so that the
// device memory and charges of the pages it moves out go back at once; its next
// decode builds its tables again. Adds the incoming pages dropped to *moved.
absl::Status drop_views(ssa_session& t, uint64_t* moved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state(t).mu) {
  SessionState& st = state(t);
  if (!st.incoming.empty()) {
    const size_t n = st.incoming.size();
    SSA_RETURN_IF_ERROR(drop_incoming(st));
    *moved += n;
  }
  st.drop_tables();
  for (uint32_t l = 0; l < t.layout.n_layers; ++l) drop_copies(layer_tiers(st, l, t.layout.n_layers), 0);
  return absl::OkStatus();
}

// Moves `pages` of `t` (device pages, movable) to its host tier, after
// drop_views. A page brought in earlier and not written since goes back to the
// host page it kept (no copy). Adds the pages moved to *moved.
absl::Status move_out(ssa_session& t, const std::vector<LayerPage>& pages, uint64_t* moved)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state(t).mu) {
  SessionState& st = state(t);
  TieredKvPool& pool = *st.kv_pool;
  std::map<uint32_t, std::vector<std::pair<size_t, PageRef>>> moves;  // by layer
  for (const LayerPage& p : pages) {
    const PageRef& page = t.layers[p.layer].kv_pages[p.page];
    if (PageRef backed = take_backing(*st.tiers[p.layer], p.page, page)) {
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
    SSA_RETURN_IF_ERROR(move_pages(t, l, m, pool.page_bytes(), "page move to the host tier"));
    *moved += n;
  }
  return absl::OkStatus();
}

// Moves up to `count` of idle peer `t`'s movable device pages to its host tier
// (t held exclusively by the caller), least recently read first over all its
// layers. Its cached copies go too: the reserving session may need the cache
// account. Adds the pages moved to *moved.
absl::Status give_up(ssa_session& t, uint64_t count, uint64_t* moved) {
  SessionState& st = state(t);
  if (!st.kv_pool->tiered() || st.steps_reserved.load()) return absl::OkStatus();  // its steps read its tables
  absl::MutexLock lock(&st.mu);
  SSA_RETURN_IF_ERROR(drop_views(t, moved));
  return move_out(t, plan_give_up(layer_placements(t), layer_lengths(t), t.layout.page_tokens, count), moved);
}

// How many of each layer's host pages `s` brings in at its turn, beyond the
// room kept for the turn's new pages (plan_balance), after moving out the
// device pages of its own that spread its host pages over its layers.
absl::StatusOr<std::vector<uint64_t>> balance(ssa_session& s, const Turn& turn) {
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  const uint64_t room = st.kv_pool->resident_room();
  BalancePlan plan = plan_balance(turn.placement, layer_lengths(s), s.layout.page_tokens,
                                  room > turn.new_pages ? room - turn.new_pages : 0);
  if (!plan.give_up.empty()) {
    uint64_t moved = 0;
    SSA_RETURN_IF_ERROR(drop_views(s, &moved));
    SSA_RETURN_IF_ERROR(move_out(s, plan.give_up, &moved));
  }
  return plan.bring_in;
}

// Brings layer l's host pages of `s` to the device, in `order`, while the
// budget has room beyond `keep` pages (the reservation's new pages, allocated after).
absl::Status bring_in(ssa_session& s, uint32_t l, const std::vector<size_t>& order, uint64_t keep) {
  SessionState& st = state(s);
  TieredKvPool& pool = *st.kv_pool;
  LayerStore& layer = s.layers[l];
  absl::MutexLock lock(&st.mu);
  LayerTiers& lt = layer_tiers(st, l, s.layout.n_layers);
  absl::StatusOr<std::vector<std::pair<size_t, PageRef>>> claimed = claim_blocks(pool, order, keep);
  if (!claimed.ok()) return claimed.status();
  std::vector<std::pair<size_t, PageRef>>& moves = *claimed;
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

// Before a turn of `s` (take_turn, start_turn): the pages it would bring in, per
// layer, and the reservation's new pages; idle peers give up as many device pages
// as the two need beyond the budget's room.
absl::Status make_room(ssa_session& s, uint64_t n_tokens, Turn* turn) {
  SessionState& st = state(s);
  BudgetPeers& peers = *s.rt->budget_peers;
  peers.mark_active(&s);
  {
    absl::MutexLock lock(&st.mu);
    turn->placement = layer_placements(s);
  }
  uint64_t host_pages = 0;
  turn->orders.resize(s.layout.n_layers);
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    turn->orders[l] = plan_bring_in(turn->placement[l], s.layers[l].n_tokens, s.layout.page_tokens);
    host_pages += turn->orders[l].size();
  }
  turn->new_pages = 0;  // the reservation's, allocated by reserve_layer after this
  for (const LayerStore& layer : s.layers) {
    turn->new_pages += s.layout.pages_for(layer.n_tokens + n_tokens) - s.layout.pages_for(layer.n_tokens);
    // The partly filled last page is copied first when anything else holds it (a
    // fork, the snapshot record after a checkpoint: lib/store/copy_on_write.h).
    if (layer.n_tokens % s.layout.page_tokens != 0 && layer.kv_pages.back().use_count() > 1) ++turn->new_pages;
  }
  const uint64_t wanted = host_pages + turn->new_pages;
  if (wanted == 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&st.mu);
    st.prune_retired();  // charges of tables no queued decode reads
  }
  const uint64_t room = st.kv_pool->resident_room();
  if (wanted <= room) return absl::OkStatus();
  uint64_t moved = 0;
  absl::Status status = absl::OkStatus();
  peers.visit_idle(&s, [&](ssa_session* t) {
    if (!t->mu.try_lock()) return false;  // busy: not idle
    status = give_up(*t, wanted - room - moved, &moved);
    t->mu.unlock();
    return !status.ok() || moved >= wanted - room;
  });
  return status;
}

}  // namespace

absl::Status take_turn(ssa_session& s, uint64_t n_tokens) {
  SessionState& st = state(s);
  if (!st.kv_pool->tiered() || s.rt->budget_peers == nullptr) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(take_incoming(s));
  Turn turn;
  SSA_RETURN_IF_ERROR(make_room(s, n_tokens, &turn));
  absl::StatusOr<std::vector<uint64_t>> counts = balance(s, turn);
  if (!counts.ok()) return counts.status();
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    std::vector<size_t>& order = turn.orders[l];
    if (order.size() > (*counts)[l]) order.resize((*counts)[l]);
    SSA_RETURN_IF_ERROR(bring_in(s, l, order, turn.new_pages));
  }
  return absl::OkStatus();
}

absl::Status start_turn(ssa_session& s, uint64_t n_tokens) {
  SessionState& st = state(s);
  if (!st.kv_pool->tiered() || s.rt->budget_peers == nullptr || st.steps_reserved.load()) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(take_incoming(s));  // an earlier start's
  Turn turn;
  SSA_RETURN_IF_ERROR(make_room(s, n_tokens, &turn));
  TieredKvPool& pool = *st.kv_pool;
  absl::MutexLock lock(&st.mu);
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    absl::StatusOr<std::vector<std::pair<size_t, PageRef>>> claimed = claim_blocks(pool, turn.orders[l], turn.new_pages);
    if (!claimed.ok()) {
      st.incoming.clear();  // nothing queued yet
      return claimed.status();
    }
    for (auto& [i, dev] : *claimed) st.incoming.push_back({l, i, s.layers[l].kv_pages[i], std::move(dev)});
  }
  if (st.incoming.empty()) return absl::OkStatus();
  const cudaError_t e = queue_incoming(st, pool.page_bytes());
  if (e != cudaSuccess) {
    // Copies queued before the failure may still write the blocks.
    if (st.move_stream != nullptr) cudaStreamSynchronize(st.move_stream);
    cudaGetLastError();
    st.incoming.clear();
    SSA_CUDA_RETURN(e, "queueing a prefetch's page copies");
  }
  return absl::OkStatus();
}

}  // namespace ssa::cuda
