// Which K/V pages of a layer a tiered CUDA session keeps on the device
// (docs/TIERED_MEMORY.md). Host-only logic, tested without a GPU.
//
//  - Pinned to the device (while the budget allows): the pages holding the first
//    kDeviceHeadTokens tokens (the attention sink every decode reads) and the
//    newest kDeviceTailTokens tokens (the local window every decode reads, and
//    the pages appends write).
//  - Every other page is movable: when pinned pages or new pages need room, the
//    movable device pages least recently read by a decode go to the host first
//    (never read: oldest position first).
//  - Pages shared with a fork stay where they are: moving them would free no
//    device memory.
// Codes and codebooks are always on the device; they are not pages of this policy.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "page.h"

namespace ssa {

inline constexpr uint64_t kDeviceHeadTokens = 128;
inline constexpr uint64_t kDeviceTailTokens = 1024;

// True when page `index` of a layer of n_tokens tokens holds a pinned token.
bool pinned_to_device(uint64_t index, uint64_t n_tokens, uint32_t page_tokens);

struct PagePlacement {
  PageTier tier = PageTier::kDevice;
  bool shared = false;     // held by another session too: never moved
  uint64_t last_read = 0;  // decode step that last read it (0 = never)
};

struct RebalancePlan {
  std::vector<size_t> to_host;    // movable device pages to move out, first victim first
  std::vector<size_t> to_device;  // pinned host pages to bring back, newest first
};

// The moves toward the policy for a layer of n_tokens tokens whose pages are
// `pages`, when `new_pages` more pinned pages are about to be allocated and
// the device can take `room` more pages now. Victims are chosen for every
// pinned page that needs a place beyond `room` (their memory may be freed only
// later, once queued decodes are done: the caller places what fits now and the
// rest at a later call).
RebalancePlan plan_rebalance(const std::vector<PagePlacement>& pages, uint64_t n_tokens, uint32_t page_tokens,
                             uint64_t new_pages, uint64_t room);

// Sessions that take turns trade the budget (docs/TIERED_MEMORY.md, "Sessions
// taking turns"): the session about to decode brings its pages in, idle ones
// give theirs up.
//
// The host pages of a layer that its session brings back to the device when it
// becomes the one decoding, in order: pinned pages first (every decode reads
// them), then the most recently read, then the newest. Shared pages stay.
std::vector<size_t> plan_bring_in(const std::vector<PagePlacement>& pages, uint64_t n_tokens, uint32_t page_tokens);

struct LayerPage {
  uint32_t layer = 0;
  size_t page = 0;
  bool operator==(const LayerPage& o) const { return layer == o.layer && page == o.page; }
};

// At most `count` device pages an idle session gives up for another's bring-in,
// over all its layers (`pages[l]`, layer l holding n_tokens[l] tokens): the
// movable ones (not pinned, not shared), least recently read first (never read:
// oldest position first, then lowest layer).
std::vector<LayerPage> plan_give_up(const std::vector<std::vector<PagePlacement>>& pages,
                                    const std::vector<uint64_t>& n_tokens, uint32_t page_tokens, uint64_t count);

}  // namespace ssa
