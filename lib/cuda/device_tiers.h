// The tiers of a CUDA session with a device budget (docs/TIERED_MEMORY.md): the
// placement of its K/V pages between device and pinned host memory
// (lib/store/tier_policy.h), and the per-layer device cache of host pages that
// decodes read recently (lib/store/page_cache_policy.h). Decodes read every
// tier through the same page table: a host page's entry is its mapped host
// address, or the address of its device copy when cached; the bytes are the
// same, so a tiered decode equals the same decode of an untiered session.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tier_accounting.h"
#include "store/layer_store.h"
#include "store/page_cache_policy.h"
#include "store/tier_policy.h"

struct ssa_session;

namespace ssa::cuda {

struct SessionState;

// Host memory the device writes into (cudaMallocHost), freed on scope exit.
struct PinnedBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};

// One layer's tier bookkeeping, guarded by SessionState::mu.
struct LayerTiers {
  explicit LayerTiers(size_t cache_pages) : policy(cache_pages) {}
  ~LayerTiers() {
    if (ready != nullptr) {
      cudaEventSynchronize(ready);
      cudaEventDestroy(ready);
    }
  }
  PageCachePolicy policy;
  struct Copy {
    const uint8_t* host = nullptr;  // the host page it copies (stale once the layer's page differs)
    std::shared_ptr<void> host_memory;  // keeps that address from being reused for another page
    PageRef copy;                   // device page charged to the cache account
  };
  std::map<uint64_t, Copy> copies;  // by page index
  // Pages a turn brought in from the host (budget_trade.h) keep their host page:
  // while the device page is the layer's and unwritten, moving it out again is
  // a pointer swap, not a copy. Dropped when an append or a reservation's steps
  // write the page.
  struct Backing {
    PageRef host;
    std::weak_ptr<Page> device;  // the page brought in (expired or replaced: stale)
  };
  std::map<uint64_t, Backing> backing;  // by page index
  std::vector<uint64_t> last_read;  // per page: decode step that last read it (0 = never)
  uint64_t step = 0;                // decodes of this layer so far
  // Rows per page of the newest decode that recorded them, copied back for the
  // policies: valid once `ready` has passed.
  PinnedBuffer rows_host;
  size_t rows_pages = 0;
  uint64_t rows_decodes = 1;  // decodes those rows add up (a reservation's steps: many)
  cudaEvent_t ready = nullptr;
  bool pending = false;
  // Pages from this index on are written by a reservation's decode steps
  // (graph_step.h) while it lasts: never cached, a copy would go stale.
  uint64_t steps_write_from = UINT64_MAX;
};

// Whether a policy may move page i of layer l: held by this session alone (its
// snapshot record aside, which follows the move), not mapped from a file. The
// session is held exclusively.
bool page_movable(ssa_session& s, uint32_t l, size_t i);
// Puts `page` (the same bytes) in place of page i of layer l, in the layer and
// in the session's snapshot record when it holds the old one, so the next
// checkpoint sees the page unchanged. The session is held exclusively.
void replace_page(ssa_session& s, uint32_t l, size_t i, PageRef page);

// The layer's tier bookkeeping, made on first use. Caller holds st.mu.
LayerTiers& layer_tiers(SessionState& st, uint32_t layer_index, uint32_t n_layers);
// What the placement policies see of the layer's pages (lib/store/tier_policy.h).
// Caller holds st.mu.
std::vector<PagePlacement> placement_of(ssa_session& s, uint32_t l, LayerTiers& lt);
// Drops the cached copies of pages from `first_page` on. Caller holds st.mu.
void drop_copies(LayerTiers& lt, uint64_t first_page);
// The host page backing page `index` (LayerTiers::backing) when `page` is
// still the one brought in, else null; the backing is dropped either way.
PageRef take_backing(LayerTiers& lt, size_t index, const PageRef& page);
// Drops the cached copies and host backings of pages from `first_page` on, which
// are about to be written. Caller holds st.mu.
void drop_written(LayerTiers& lt, uint64_t first_page);
// Copies each (page index, new page) of `moves` from layer l's page, in one
// launch on the legacy default stream (where the library allocates and writes
// pages; kernels/page_copy.h) with one wait at the end, then puts the new pages in place (replace_page); the
// old pages are dropped only then, after their copies. On a copy error no page
// of the layer changes. Empties `moves`. The session is held exclusively.
absl::Status move_pages(ssa_session& s, uint32_t l, std::vector<std::pair<size_t, PageRef>>& moves, size_t bytes,
                        const char* what);

// Before an append to `layer` that writes its pages from `first_written` on
// and allocates `new_pages` pages: drops the cached copies of the pages it
// writes (they would go stale), then moves movable
// device pages to the host and pinned host pages back to the device as the
// policy says and the budget allows (content unchanged; the session is held
// exclusively). A move that cannot be made (no room, no host memory) is left
// for a later call; only device errors are returned.
absl::Status rebalance_layer(ssa_session& s, uint32_t layer_index, LayerStore& layer, uint64_t first_written,
                             uint64_t new_pages);

// The entry of each page in a decode's tables: its address (the device copy's
// for a cached host page) and tier code, after taking in what the newest
// finished decode of the layer read and updating the cache (copies made on the
// session's stream, complete on return). Caller holds st.mu.
absl::Status tier_view(SessionState& st, uint32_t layer_index, const LayerStore& layer,
                       std::vector<const uint8_t*>* addresses, std::vector<uint8_t>* tiers,
                       std::vector<std::shared_ptr<void>>* memory);

// Queues the copy of `n` pages' read counts (device, zeroed after the copy) back
// to the layer's bookkeeping for the next tier_view, which takes them in once
// the copy has run; `decodes` is how many decodes they add up, so that many
// decodes' worth of pages may be admitted to the cache. Caller holds st.mu.
cudaError_t queue_page_reads(SessionState& st, uint32_t layer_index, uint32_t n_layers, uint32_t* page_rows,
                             size_t n, uint64_t decodes, cudaStream_t stream);

// A reservation's steps write the layer's pages from `first_page` on
// (UINT64_MAX: no reservation any more): drops their cached copies and admits
// none while it lasts. Caller holds st.mu.
void set_steps_write_from(SessionState& st, uint32_t layer_index, uint32_t n_layers, uint64_t first_page);

// True when some page of the layer is not a device page (its decodes count tiers).
bool layer_has_host_pages(const LayerStore& layer);
// Whether any page of the layer is mapped from a snapshot file.
bool layer_has_file_pages(const LayerStore& layer);

}  // namespace ssa::cuda
