// The CUDA backend's state of one session (lib/backend.h BackendSession): its
// device page pools, its own stream, and the cache of device page tables and
// codebooks that decodes read, with what keeps that memory alive while queued
// decodes may read it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backend.h"
#include "device_mem.h"
#include "device_pages.h"
#include "device_tiers.h"
#include "kernels/decode_types.h"
#include "kernels/pq_index.h"
#include "kernels/step_plan.h"
#include "last_use.h"
#include "pinned_pages.h"
#include "runtime.h"
#include "session.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "tiered_pool.h"

namespace ssa::cuda {

struct StepReservation;  // graph_step.h
struct SessionState;
// Ends a session's decode-step reservation at its destruction (graph_step.cc).
void retire_steps(SessionState& st);
// Step events outlive their sessions: a graph may still record one
// (graph_step.cc). A returned event goes to the next session that reserves.
void return_step_event(int device, cudaEvent_t e);

// Device-side state of one session: page tables per layer (rebuilt when the
// layer's pages change), device copies of codebooks, and what keeps memory that
// queued decodes read alive. Decodes return once their kernels are queued, so
// nothing they read may be freed or recycled until their LastUse event has
// passed: a layer's tables hold its pages' memory and its codebooks, and tables
// replaced after a change wait in `retired` until then. Nothing here waits for
// the device as a whole.
struct SessionState final : BackendSession {
  int device = 0;
  std::shared_ptr<TieredKvPool> kv_pool;  // K/V pages: device, or host beyond the runtime's budget
  std::shared_ptr<DevicePagePool> code_pool;
  size_t cache_pages_per_layer = 0;  // capacity of each layer's cache of host pages
  // Whether the device reads pageable host memory (file pages in place); if not,
  // decodes copy the rows they read from file pages into pinned pages of this
  // pool first (file_staging.h: file_stage_pool, made on first use).
  bool reads_pageable = false;
  // Table and codebook uploads (and their frees): non-blocking, so they never
  // wait for work on other streams.
  cudaStream_t stream = nullptr;
  // The NaN/Inf scan's two result slots, kept between appends (which take the
  // session exclusively).
  DeviceMem scan_result;
  // Asynchronous appends: recorded on the legacy default stream before one (the
  // append's stream waits for it) and on its stream after it (the legacy stream
  // waits). Created on the first; appends take the session exclusively.
  cudaEvent_t append_order[2] = {nullptr, nullptr};
  absl::Mutex mu;
  std::shared_ptr<PinnedPagePool> file_stage_pool ABSL_GUARDED_BY(mu);
  struct Books {
    CodebooksRef host;  // keeps the key alive
    DeviceMem dev;
  };
  struct LayerCache {
    uint32_t layer = 0;
    std::vector<const uint8_t*> kv, code;  // table entries, to notice a change
    const PqCodebooks* books_key = nullptr;
    std::vector<std::shared_ptr<void>> memory;  // the pages' memory (Page::keeper)
    std::shared_ptr<Books> books;
    DeviceMem kv_table, code_table;
    // Tiered sessions: the TierCode of each page and the rows per page that
    // decodes through these tables read (kernels/tier_accounting.h).
    bool tiered = false;
    DeviceMem tier_table, page_rows;
    LastUse last_use;
    uint64_t tokens_read = 0;  // the longest context any decode through it read
  };
  std::vector<std::shared_ptr<LayerCache>> layers ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<LayerCache>> retired ABSL_GUARDED_BY(mu);
  std::map<const PqCodebooks*, std::shared_ptr<Books>> books ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<LayerTiers>> tiers ABSL_GUARDED_BY(mu);  // tiered sessions, per layer
  // A sharded session (a runtime over several devices, docs/SHARDING.md): this
  // state is shard 0's, and these are shards 1..S-1's, each on its own device
  // with its own pools, stream and table cache. Empty when unsharded.
  std::vector<std::shared_ptr<SessionState>> other_shards;
  // Decode steps (graph_step.h): the reservation they append into (set and
  // ended under the session's exclusive lock; steps read it under a shared
  // one), the event each step records last, and the session's guard slot.
  std::shared_ptr<StepReservation> reservation;
  std::atomic<bool> steps_reserved{false};  // reservation != null, read without the lock
  cudaEvent_t step_done = nullptr;
  StepGuard* guard = nullptr;
  uint64_t steps_dropped = 0;  // dropped steps counted by the guard, not yet reported
  // A turn started ahead (ssa_session_prefetch, budget_trade.h): host pages being
  // copied to the device blocks beside them on `move_stream` (non-blocking: the
  // copies run while other sessions decode). Each stays the layer's page until
  // its copy has passed `moves_done` and the session takes it in; nothing else
  // may use or free its block before then.
  struct IncomingPage {
    uint32_t layer = 0;
    size_t index = 0;
    PageRef host, dev;
  };
  std::vector<IncomingPage> incoming ABSL_GUARDED_BY(mu);
  cudaStream_t move_stream = nullptr;
  cudaEvent_t moves_order = nullptr, moves_done = nullptr;

  SessionState() = default;
  SessionState(const SessionState&) = delete;
  SessionState& operator=(const SessionState&) = delete;
  // Waits for this session's queued decodes, then frees (in stream order).
  ~SessionState() {
    retire_steps(*this);  // waits for queued steps; their replays then do nothing
    absl::MutexLock lock(&mu);
    if (moves_done != nullptr) cudaEventSynchronize(moves_done);  // blocks in flight go back after
    incoming.clear();
    if (move_stream != nullptr) cudaStreamDestroy(move_stream);
    for (cudaEvent_t e : {moves_order, moves_done})
      if (e != nullptr) cudaEventDestroy(e);
    drop_tables();
    tiers.clear();
    books.clear();  // (scan_result and codebooks are freed on the legacy default stream)
    if (stream != nullptr) {
      // Tables are freed on it: done before the pool is trimmed (destroy).
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    for (cudaEvent_t e : append_order)
      if (e != nullptr) cudaEventDestroy(e);
    if (step_done != nullptr) return_step_event(device, step_done);
  }

  // The device copy of `host`, uploaded on first use (complete on return).
  absl::StatusOr<std::shared_ptr<Books>> device_books(const CodebooksRef& host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records `dev` (complete) as the device copy of `host`.
  void seed_device_books(const CodebooksRef& host, DeviceMem&& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    forget_unused_books();
    auto b = std::make_shared<Books>();
    b->host = host;
    b->dev = std::move(dev);
    books[host.get()] = std::move(b);
  }
  // Forgets device copies of codebooks no layer holds any more (tables that
  // queued decodes read keep theirs).
  void forget_unused_books() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto i = books.begin(); i != books.end();) {
      if (i->second->host.use_count() == 1) i = books.erase(i); else ++i;
    }
  }

  // Waits for every queued decode through the cached tables, then drops them:
  // the memory they held (pages, codebooks) goes back now; the next decode
  // builds its tables again.
  void drop_tables() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const auto& c : layers)
      if (c) c->last_use.wait();
    for (const auto& c : retired) c->last_use.wait();
    layers.clear();
    retired.clear();
  }

  // Frees retired tables whose decodes have all run.
  void prune_retired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    retired.erase(std::remove_if(retired.begin(), retired.end(),
                                 [](const std::shared_ptr<LayerCache>& c) { return !c->last_use.pending(); }),
                  retired.end());
  }
};

// The state of a session of the CUDA backend (of shard 0, when sharded).
inline SessionState& state(const ssa_session& s) { return static_cast<SessionState&>(*s.backend_state); }

// Shard `shard`'s state (0 = state(s)); shard < the runtime's shard count.
inline SessionState& shard_state(const ssa_session& s, uint32_t shard) {
  return shard == 0 ? state(s) : *state(s).other_shards[shard - 1];
}
inline uint32_t shard_count(const ssa_session& s) {
  return 1 + static_cast<uint32_t>(state(s).other_shards.size());
}
// The shard whose device holds page `page` of a layer (shard boundaries are
// whole pages; the last shard takes every page beyond the others).
inline uint32_t shard_of_page(const ssa_session& s, uint64_t page) {
  const uint64_t shard = page * s.layout.page_tokens / s.rt->shard_tokens;
  return static_cast<uint32_t>(std::min<uint64_t>(shard, shard_count(s) - 1));
}

// A new state on `device` with these page pools (a fork shares its source's).
absl::StatusOr<std::shared_ptr<SessionState>> new_state(int device, std::shared_ptr<TieredKvPool> kv,
                                                        std::shared_ptr<DevicePagePool> code);

// The device codebooks an append encodes with.
absl::StatusOr<const float*> device_books(SessionState& st, const CodebooksRef& host);

// The matrix queries are multiplied by before their tables are built, inside
// device codebooks `b` (device_books_layout, kernels/pq_index.h); null for
// codebooks without a transform.
inline const float* device_query_transform(const SessionState::Books& b) {
  const PqCodebooks& h = *b.host;
  if (!h.rotated()) return nullptr;
  return static_cast<const float*>(b.dev.p) + h.data.size() + h.rotation.size();
}

// The device page tables and codebooks of a layer for a decode (into item),
// uploaded once per change of the layer. The tables they replace are retired,
// not freed: decodes queued earlier may still read them.
absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> layer_tables(const ssa_session& s, uint32_t layer_index,
                                                                      const LayerStore& layer, DecodeItem* item);
// The same for one rank of a sharded decode: pages [page_begin, page_end) of the
// layer (with their codes and the layer's codebooks), cached in the state `st`
// of the shard the rank runs on, on its device. extent: the tokens a decode
// through them reads, counted from the shard's first token (what a truncation
// waits for, before_truncate), past the shard's end where the pages are.
absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> layer_tables(const ssa_session& s, SessionState& st,
                                                                      uint32_t layer_index, const LayerStore& layer,
                                                                      size_t page_begin, size_t page_end,
                                                                      uint64_t extent, DecodeItem* item);

// After a decode through `tables` queued on `stream` (and its tier accounting):
// queues the copy of the rows it read per page back to the host, for the tier
// policies to take in at a later decode (lib/cuda/device_tiers.h). Nothing is
// queued on a stream being captured into a graph.
cudaError_t queue_tier_readback(const ssa_session& s, SessionState::LayerCache& tables, cudaStream_t stream);

// The kernels' view of a session's layout.
// The index shape of a session's layout and proxy (code width, key transform).
PqIndexShape index_shape(const KvLayout& L, ssa_proxy proxy);
DecodeShape decode_shape(const KvLayout& L);

}  // namespace ssa::cuda
