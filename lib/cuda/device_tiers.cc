#include "device_tiers.h"

#include <algorithm>

#include "device_error.h"
#include "device_mem.h"
#include "device_state.h"
#include "session.h"
#include "snapshot/record.h"
#include "store/tier_policy.h"
#include "kernels/page_copy.h"

namespace ssa::cuda {
namespace {

// Copies into the cache per decode, in bytes: a decode never waits long for them.
constexpr size_t kAdmitBytesPerDecode = size_t{4} << 20;
// Read counts that add up many decodes (a reservation's steps) admit that many
// decodes' worth, up to this many: the copies run when the next reservation is
// made, which waits for them.
constexpr uint64_t kMaxDecodesAdmitted = 16;

// Drops the cached copy `it`: the next decode's table points at the host page again
// (tables are rebuilt when an entry's address changes).
std::map<uint64_t, LayerTiers::Copy>::iterator drop_copy(LayerTiers& lt,
                                                         std::map<uint64_t, LayerTiers::Copy>::iterator it) {
  lt.policy.forget(it->first);
  return lt.copies.erase(it);
}

// Takes in the rows per page of the newest decode (or reservation's steps) of the
// layer once its read-back has run: recency of use for the placement, reads of
// host pages for the cache.
absl::Status take_in_reads(SessionState& st, LayerTiers& lt, const LayerStore& layer) {
  if (!lt.pending) return absl::OkStatus();
  const cudaError_t q = cudaEventQuery(lt.ready);
  if (q == cudaErrorNotReady) return absl::OkStatus();
  SSA_CUDA_RETURN(q, "tier accounting read-back");
  lt.pending = false;
  const uint64_t step = ++lt.step;
  const size_t n = std::min(lt.rows_pages, layer.kv_pages.size());
  const uint32_t* rows = static_cast<const uint32_t*>(lt.rows_host.p);
  std::vector<PageCachePolicy::PageReads> reads;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] == 0) continue;
    lt.last_read[i] = step;
    if (layer.kv_pages[i]->tier() != PageTier::kDevice && i < lt.steps_write_from) reads.push_back({i, rows[i]});
  }
  const size_t page_bytes = st.kv_pool->page_bytes();
  const uint64_t decodes = std::min<uint64_t>(std::max<uint64_t>(lt.rows_decodes, 1), kMaxDecodesAdmitted);
  const PageCachePolicy::Update u =
      lt.policy.observe(reads, step, std::max<size_t>(1, decodes * kAdmitBytesPerDecode / page_bytes));
  for (uint64_t e : u.evict) {
    auto it = lt.copies.find(e);
    if (it != lt.copies.end()) drop_copy(lt, it);
  }
  // The copies' pages first: they are allocated and zeroed on the legacy default
  // stream (device_pages.cc), and the copies run on the session's stream.
  std::vector<std::pair<uint64_t, PageRef>> fresh;
  for (size_t a = 0; a < u.admit.size(); ++a) {
    absl::StatusOr<PageRef> dev = st.kv_pool->device_page(DeviceBudget::kCache);
    if (!dev.ok() || *dev == nullptr) {
      // No room in the cache account (or no device memory): not cached.
      for (size_t b = a; b < u.admit.size(); ++b) lt.policy.forget(u.admit[b]);
      break;
    }
    fresh.emplace_back(u.admit[a], *std::move(dev));
  }
  if (fresh.empty()) return absl::OkStatus();
  // So the session's stream waits for the legacy stream's work on those pages.
  cudaEvent_t allocated = nullptr;
  SSA_CUDA_RETURN(cudaEventCreateWithFlags(&allocated, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t e = cudaEventRecord(allocated, nullptr);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(st.stream, allocated, 0);
  cudaEventDestroy(allocated);
  SSA_CUDA_RETURN(e, "cache page ordering");
  for (auto& [page, dev] : fresh) {
    const Page& src = *layer.kv_pages[page];
    SSA_CUDA_RETURN(cudaMemcpyAsync(dev->mutable_data(), src.data(), page_bytes, cudaMemcpyDefault, st.stream),
                    "host page copy into the cache");
    lt.copies[page] = LayerTiers::Copy{src.data(), src.keeper(), std::move(dev)};
  }
  // A copy is complete before any table points at it.
  SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "host page copy into the cache");
  return absl::OkStatus();
}

// The session's snapshot record's reference to page i of layer l (record.h:
// the pages its file holds, by identity), or null when it holds another page
// or none. The caller holds s exclusively: checkpoints change the record under
// a shared hold.
PageRef* recorded_page(ssa_session& s, uint32_t l, size_t i) {
  if (s.snapshot == nullptr || s.snapshot->record == nullptr) return nullptr;
  SnapshotRecord& rec = *s.snapshot->record;
  if (l >= rec.layers.size() || i >= rec.layers[l].kv.size()) return nullptr;
  PageRef& p = rec.layers[l].kv[i];
  return p == s.layers[l].kv_pages[i] ? &p : nullptr;
}

}  // namespace

bool page_movable(ssa_session& s, uint32_t l, size_t i) {
  const PageRef& p = s.layers[l].kv_pages[i];
  return p->tier() != PageTier::kFile && p.use_count() == 1 + (recorded_page(s, l, i) != nullptr ? 1 : 0);
}

void replace_page(ssa_session& s, uint32_t l, size_t i, PageRef page) {
  if (PageRef* r = recorded_page(s, l, i)) *r = page;  // the same bytes: the next checkpoint writes nothing for it
  s.layers[l].kv_pages[i] = std::move(page);
}

LayerTiers& layer_tiers(SessionState& st, uint32_t layer_index, uint32_t n_layers) {
  if (st.tiers.size() < n_layers) st.tiers.resize(n_layers);
  std::unique_ptr<LayerTiers>& t = st.tiers[layer_index];
  if (t == nullptr) t = std::make_unique<LayerTiers>(st.cache_pages_per_layer);
  return *t;
}

std::vector<PagePlacement> placement_of(ssa_session& s, uint32_t l, LayerTiers& lt) {
  const LayerStore& layer = s.layers[l];
  lt.last_read.resize(layer.kv_pages.size(), 0);
  std::vector<PagePlacement> placement(layer.kv_pages.size());
  for (size_t i = 0; i < placement.size(); ++i) {
    placement[i].tier = layer.kv_pages[i]->tier() == PageTier::kDevice ? PageTier::kDevice : PageTier::kHost;
    placement[i].shared = !page_movable(s, l, i);
    placement[i].last_read = lt.last_read[i];
  }
  return placement;
}

void drop_copies(LayerTiers& lt, uint64_t first_page) {
  for (auto it = lt.copies.lower_bound(first_page); it != lt.copies.end();) it = drop_copy(lt, it);
}

PageRef take_backing(LayerTiers& lt, size_t index, const PageRef& page) {
  auto b = lt.backing.find(index);
  if (b == lt.backing.end()) return nullptr;
  PageRef host = b->second.device.lock() == page ? std::move(b->second.host) : nullptr;
  lt.backing.erase(b);
  return host;
}

void drop_written(LayerTiers& lt, uint64_t first_page) {
  drop_copies(lt, first_page);
  lt.backing.erase(lt.backing.lower_bound(first_page), lt.backing.end());
}

// One launch and one wait per batch, not a copy call per page: a move of
// thousands of pages is bounded by the bus, not by the calls' host time
// (kernels/page_copy.h).
absl::Status move_pages(ssa_session& s, uint32_t l, std::vector<std::pair<size_t, PageRef>>& moves, size_t bytes,
                        const char* what) {
  const LayerStore& layer = s.layers[l];
  if (moves.empty()) return absl::OkStatus();
  std::vector<PageCopy> copies;
  copies.reserve(moves.size());
  bool in_place = true;  // every page device memory or pinned host memory (a tiered session's tiers)
  for (auto& [i, to] : moves) {
    copies.push_back({layer.kv_pages[i]->data(), to->mutable_data()});
    in_place = in_place && layer.kv_pages[i]->tier() != PageTier::kFile && to->tier() != PageTier::kFile;
  }
  cudaError_t e = cudaSuccess;
  if (in_place && page_copies_aligned(copies.data(), copies.size(), bytes)) {
    DeviceMem list;
    e = list.alloc(copies.size() * sizeof(PageCopy), nullptr);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(list.p, copies.data(), copies.size() * sizeof(PageCopy), cudaMemcpyHostToDevice, nullptr);
    if (e == cudaSuccess)
      e = launch_copy_pages(static_cast<const PageCopy*>(list.p), static_cast<uint32_t>(copies.size()), bytes, nullptr);
  } else {
    for (const PageCopy& c : copies) {
      e = cudaMemcpyAsync(c.dst, c.src, bytes, cudaMemcpyDefault, nullptr);
      if (e != cudaSuccess) break;
    }
  }
  // Also after a failed launch: the copies queued before it still write the new pages.
  const cudaError_t done = cudaStreamSynchronize(nullptr);
  if (e == cudaSuccess) e = done;
  if (e == cudaSuccess) {
    for (auto& [i, to] : moves) replace_page(s, l, i, std::move(to));
  }
  moves.clear();
  SSA_CUDA_RETURN(e, what);
  return absl::OkStatus();
}

// A group rank's layer has no page where another rank holds the tokens (null).
bool layer_has_host_pages(const LayerStore& layer) {
  for (const PageRef& p : layer.kv_pages)
    if (p != nullptr && p->tier() != PageTier::kDevice) return true;
  return false;
}

bool layer_has_file_pages(const LayerStore& layer) {
  for (const PageRef& p : layer.kv_pages)
    if (p != nullptr && p->tier() == PageTier::kFile) return true;
  return false;
}

absl::Status rebalance_layer(ssa_session& s, uint32_t layer_index, LayerStore& layer, uint64_t first_written,
                             uint64_t new_pages) {
  SessionState& st = state(s);
  TieredKvPool& pool = *st.kv_pool;
  absl::MutexLock lock(&st.mu);
  LayerTiers& lt = layer_tiers(st, layer_index, s.layout.n_layers);
  // The append writes rows into these pages in place: their copies would miss them.
  drop_written(lt, first_written);
  if (!pool.tiered()) return absl::OkStatus();
  st.prune_retired();  // tables no queued decode reads any more give their pages' charges back
  const std::vector<PagePlacement> placement = placement_of(s, layer_index, lt);
  const RebalancePlan plan =
      plan_rebalance(placement, layer.n_tokens, s.layout.page_tokens, new_pages, pool.resident_room());
  std::vector<std::pair<size_t, PageRef>> moves;
  for (size_t i : plan.to_host) {
    if (PageRef backed = take_backing(lt, i, layer.kv_pages[i])) {  // the same bytes on the host already
      replace_page(s, layer_index, i, std::move(backed));
      continue;
    }
    absl::StatusOr<PageRef> host = pool.host_page();
    if (!host.ok()) break;  // no host memory: the page stays (the append may still fit)
    moves.emplace_back(i, *std::move(host));
  }
  SSA_RETURN_IF_ERROR(move_pages(s, layer_index, moves, pool.page_bytes(), "page move to the host tier"));
  // The device pages that left gave their charges back: room for these.
  for (size_t i : plan.to_device) {
    // Not zeroed: move_pages overwrites the whole page.
    absl::StatusOr<PageRef> dev = pool.device_page(DeviceBudget::kResident, false);
    if (!dev.ok() || *dev == nullptr) break;  // no room yet: a later append brings it back
    moves.emplace_back(i, *std::move(dev));
  }
  return move_pages(s, layer_index, moves, pool.page_bytes(), "page move to the device");
}

absl::Status tier_view(SessionState& st, uint32_t layer_index, const LayerStore& layer,
                       std::vector<const uint8_t*>* addresses, std::vector<uint8_t>* tiers,
                       std::vector<std::shared_ptr<void>>* memory) {
  LayerTiers& lt = layer_tiers(st, layer_index, layer_index + 1);
  const size_t n = layer.kv_pages.size();
  lt.last_read.resize(n, 0);
  SSA_RETURN_IF_ERROR(take_in_reads(st, lt, layer));
  // Copies of pages the layer no longer holds (truncated, moved, rewritten).
  for (auto it = lt.copies.begin(); it != lt.copies.end();) {
    if (it->first >= n || it->first >= lt.steps_write_from || layer.kv_pages[it->first]->data() != it->second.host) {
      it = drop_copy(lt, it);
    } else {
      ++it;
    }
  }
  addresses->resize(n);
  tiers->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Page& p = *layer.kv_pages[i];
    auto c = lt.copies.find(i);
    if (c != lt.copies.end()) {
      (*addresses)[i] = c->second.copy->data();
      (*tiers)[i] = kTierCached;
      memory->push_back(c->second.copy->keeper());
    } else {
      (*addresses)[i] = p.data();
      (*tiers)[i] = p.tier() == PageTier::kDevice ? kTierDevice : p.tier() == PageTier::kFile ? kTierFile : kTierHost;
    }
    memory->push_back(p.keeper());
  }
  return absl::OkStatus();
}

cudaError_t queue_page_reads(SessionState& st, uint32_t layer_index, uint32_t n_layers, uint32_t* page_rows,
                             size_t n, uint64_t decodes, cudaStream_t stream) {
  LayerTiers& lt = layer_tiers(st, layer_index, n_layers);
  const size_t bytes = n * sizeof(uint32_t);
  cudaError_t e = cudaSuccess;
  if (lt.rows_host.bytes < bytes) {
    if (lt.pending && (e = cudaEventSynchronize(lt.ready)) != cudaSuccess) return e;
    lt.pending = false;
    const size_t grown = std::max(bytes, 2 * lt.rows_host.bytes);
    if (lt.rows_host.p != nullptr) cudaFreeHost(lt.rows_host.p);
    lt.rows_host.p = nullptr;
    lt.rows_host.bytes = 0;
    if ((e = cudaMallocHost(&lt.rows_host.p, grown)) != cudaSuccess) return e;
    lt.rows_host.bytes = grown;
  }
  if (lt.ready == nullptr && (e = cudaEventCreateWithFlags(&lt.ready, cudaEventDisableTiming)) != cudaSuccess) {
    return e;
  }
  if ((e = cudaMemcpyAsync(lt.rows_host.p, page_rows, bytes, cudaMemcpyDeviceToHost, stream)) != cudaSuccess ||
      (e = cudaMemsetAsync(page_rows, 0, bytes, stream)) != cudaSuccess ||
      (e = cudaEventRecord(lt.ready, stream)) != cudaSuccess) {
    return e;
  }
  lt.pending = true;
  lt.rows_pages = n;
  lt.rows_decodes = decodes;
  return cudaSuccess;
}

void set_steps_write_from(SessionState& st, uint32_t layer_index, uint32_t n_layers, uint64_t first_page) {
  LayerTiers& lt = layer_tiers(st, layer_index, n_layers);
  lt.steps_write_from = first_page;
  drop_written(lt, first_page);
}

cudaError_t queue_tier_readback(const ssa_session& s, SessionState::LayerCache& tables, cudaStream_t stream) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &cap);
  if (e != cudaSuccess || cap != cudaStreamCaptureStatusNone) return e;
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  return queue_page_reads(st, tables.layer, s.layout.n_layers, static_cast<uint32_t*>(tables.page_rows.p),
                          tables.kv.size(), 1, stream);
}

}  // namespace ssa::cuda
