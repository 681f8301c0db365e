// A session: one sequence's KV store over all layers, its PQ index and the lock
// that lets many decodes run beside each other while mutations run alone.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime.h"
#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "store/page_pool.h"

namespace ssa::cuda {
struct SessionState;  // CUDA backend hook: device state (lib/cuda/cuda_backend.h)
}

struct ssa_session {
  ssa_runtime* rt = nullptr;
  ssa_session_config config{};  // as given at create, defaults resolved
  ssa::KvLayout layout;
  std::shared_ptr<ssa::PagePool> kv_pool, code_pool;
  // CUDA backend hook: set for sessions of a CUDA runtime (pages in device memory).
  std::shared_ptr<ssa::cuda::SessionState> cuda;

  // Readers (decode, fork, save) share it; append/update_index/truncate own it.
  mutable absl::Mutex mu;
  std::vector<ssa::LayerStore> layers ABSL_GUARDED_BY(mu);
};

namespace ssa {

// Validates a config and resolves defaults into a layout.
absl::Status validate_session_config(const ssa_session_config& cfg, KvLayout* layout);

// Creates an empty session (no pages yet).
absl::StatusOr<std::unique_ptr<ssa_session>> create_session(ssa_runtime* rt,
                                                            const ssa_session_config& cfg);

uint64_t session_length_locked(const ssa_session& s) ABSL_SHARED_LOCKS_REQUIRED(s.mu);

// The mutations behind the C API. Each takes the session lock itself and is
// all-or-nothing.
absl::Status session_append(ssa_session& s, uint32_t layer, const void* k, const void* v,
                            uint64_t n_tokens);
absl::Status session_update_index(ssa_session& s);
// Trains one layer's index if it has none (on-demand training by decode).
absl::Status session_ensure_index(ssa_session& s, uint32_t layer);
absl::Status session_truncate(ssa_session& s, uint64_t n_tokens);
absl::StatusOr<std::unique_ptr<ssa_session>> session_fork(ssa_session& s);

}  // namespace ssa
