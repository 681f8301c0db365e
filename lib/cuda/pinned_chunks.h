// A runtime's pre-pinned host memory (ssa_runtime_options.host_pool_bytes):
// chunks of pinned, device-mapped host memory page-locked once, when the runtime
// is created, and lent to its sessions' host tiers (PinnedPagePool) before they
// pin anything new. Page-locking runs at about 2 GB/s, tens of times slower than
// the bus: done during a fill it bounds the fill's rate into the host tier.
// Chunks come back here when a session's pool goes, never to the OS while the
// runtime lives; the last holder (runtime or session pool) frees them.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/host_pool_option.h"

namespace ssa::cuda {

class PinnedChunkPool {
 public:
  // The chunk size, the one PinnedPagePool pins by default.
  static constexpr size_t kChunkBytes = kHostPoolChunkBytes;

  // Page-locks `bytes` (a positive multiple of kChunkBytes) on the current
  // device's context. SSA_ERR_OUT_OF_MEMORY when a chunk cannot be pinned,
  // SSA_ERR_UNSUPPORTED without unified addressing; on error nothing is kept.
  static absl::StatusOr<std::shared_ptr<PinnedChunkPool>> create(uint64_t bytes);
  ~PinnedChunkPool();
  PinnedChunkPool(const PinnedChunkPool&) = delete;
  PinnedChunkPool& operator=(const PinnedChunkPool&) = delete;

  // A free chunk of kChunkBytes, or null when every chunk is lent.
  void* take();
  // Returns a chunk from take(), zeroed by the caller (chunks are lent zeroed,
  // as the OS gives fresh memory); no device work may still use it.
  void give_back(void* chunk);

  uint64_t bytes() const { return uint64_t{chunks_.size()} * kChunkBytes; }
  uint64_t free_bytes() const;

 private:
  explicit PinnedChunkPool(std::vector<void*> chunks) : chunks_(chunks), free_(std::move(chunks)) {}

  const std::vector<void*> chunks_;
  mutable absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

// Test hooks: the n-th chunk allocation of create() from now (1-based) fails
// (and, if `sticky`, all later ones); n = 0 disarms. Bytes of chunks pinned by
// create() and not yet freed, over every pool of the process.
void set_pinned_chunk_failure_countdown(uint64_t n, bool sticky);
uint64_t pinned_chunk_bytes_live();

}  // namespace ssa::cuda
