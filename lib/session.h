// A session: one sequence's KV store over all layers, its PQ index and the lock
// that lets many decodes run beside each other while mutations run alone.
#pragma once

#include <stdint.h>

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime.h"
#include "rw_lock.h"
#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "store/page_pool.h"

namespace ssa {
class Backend;          // lib/backend.h
struct BackendSession;  // lib/backend.h
struct SnapshotState;   // lib/snapshot/record.h
class PqEncoder;        // lib/index/pq_index.h
}  // namespace ssa

struct ssa_session {
  ssa_session() = default;
  ssa_session(const ssa_session&) = delete;
  ssa_session& operator=(const ssa_session&) = delete;
  // Leaves the runtime's budget peers first (lib/store/budget_peers.h): a
  // session taking its turn may be visiting this one to move its pages.
  ~ssa_session();

  ssa_runtime* rt = nullptr;
  ssa_session_config config{};  // as given at create, defaults resolved
  ssa::KvLayout layout;
  std::shared_ptr<ssa::PagePool> kv_pool, code_pool;  // host pages
  // The runtime's backend, and its own state of this session (null if it keeps none).
  const ssa::Backend* backend = nullptr;
  std::shared_ptr<ssa::BackendSession> backend_state;

  // Readers (decode, fork, save) share it; append/update_index/truncate own it.
  // Writer-preferring (lib/rw_lock.h): a stream of decodes cannot starve an append.
  mutable ssa::RwLock mu;
  std::vector<ssa::LayerStore> layers;  // guarded by mu
  // Per layer, the encoder of its current codebooks (built on the first append
  // that encodes; holds the codebooks it was built from). Appends own mu.
  std::vector<std::shared_ptr<const ssa::PqEncoder>> encoders;  // guarded by mu
  // User metadata saved with the session's snapshots (ssa_session_set_metadata).
  std::string metadata;  // guarded by mu
  // What save/checkpoint/load last wrote to or read from which file, for
  // incremental checkpoints (lib/snapshot/record.h). Taken before mu.
  std::mutex snapshot_mu;
  std::shared_ptr<ssa::SnapshotState> snapshot;  // guarded by snapshot_mu
};

namespace ssa {

// Upper bound on tokens per layer: token indices are 32-bit inside the decode.
inline constexpr uint64_t kMaxTokensPerLayer = 0xFFFFFFFFull;
// Upper bound on one KV page (K and V of page_tokens tokens): every size derived
// from a page then fits comfortably in size_t, and a config that would ask for
// gigabytes per page is rejected at create instead of at the first append.
inline constexpr uint64_t kMaxKvPageBytes = uint64_t{1} << 30;
// Query values one ssa_session_observe_queries call takes (their float copy, 1
// GiB, and the head_dim^2 work per query head stay bounded).
inline constexpr uint64_t kMaxObservedQueryValues = uint64_t{1} << 28;

// Validates a config and resolves defaults into a layout.
absl::Status validate_session_config(const ssa_session_config& cfg, KvLayout* layout);

// Creates an empty session (no pages yet).
absl::StatusOr<std::unique_ptr<ssa_session>> create_session(ssa_runtime* rt,
                                                            const ssa_session_config& cfg);

// Caller holds s.mu (shared or exclusive).
uint64_t session_length_locked(const ssa_session& s);

// ssa_session_observe_queries: q [n][n_q_heads][head_dim] in the session's dtype,
// checked (layer, proxy, finite values) before the layer's moments change.
absl::Status session_observe_queries(ssa_session& s, uint32_t layer, const void* q, uint64_t n);

// Destroys a session (null: nothing), then lets its backend give back what it kept for it.
void session_destroy(ssa_session* s);

// The mutations behind the C API. Each checks its arguments, takes the session
// lock itself and is all-or-nothing. Appends check every size (the layer limit
// included) before anything reads k or v.
absl::Status session_append(ssa_session& s, uint32_t layer, const void* k, const void* v,
                            uint64_t n_tokens);
// ssa_session_append_async (stream: a cudaStream_t, null = the legacy default stream).
absl::Status session_append_async(ssa_session& s, uint32_t layer, const void* k, const void* v,
                                  uint64_t n_tokens, void* stream);
absl::Status session_update_index(ssa_session& s);
// Trains one layer's index if it has none (on-demand training by decode).
absl::Status session_ensure_index(ssa_session& s, uint32_t layer);
// Installs an index a decode trained on a copy of the layer (decode's
// `trained`), unless the layer has changed or got an index since.
void session_install_index(ssa_session& s, uint32_t layer, LayerStore trained);
absl::Status session_truncate(ssa_session& s, uint64_t n_tokens);
absl::StatusOr<std::unique_ptr<ssa_session>> session_fork(ssa_session& s);

}  // namespace ssa
