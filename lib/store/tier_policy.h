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

// The host pages a session taking its turn leaves on the host are spread over
// its layers in proportion to their pages, not left to the layers filled last:
// a decode reads every layer in turn, and a layer's reads of host rows overlap
// its reads of device rows, so host rows spread over all layers cost less than
// the same rows read by a few layers alone (docs/TIERED_MEMORY.md, "Placement
// policy": spread over the layers at a turn).
struct BalancePlan {
  std::vector<uint64_t> bring_in;  // per layer: how many of its plan_bring_in order to bring in
  std::vector<LayerPage> give_up;  // the session's own device pages to move to the host first
};

// For a session whose layers hold `pages` (layer l: n_tokens[l] tokens) when the
// device can take `room` more of its pages: what does not fit stays on the host,
// spread over the layers in proportion to their pages. Its pinned host pages all
// come in, and the layers holding more host pages than their share bring theirs
// in; where the room is not enough for that, the layers holding less give up
// movable device pages (least recently read first, then the oldest) so that as
// many more come in. Give-ups are left out when fewer than one page per layer
// would move (no churn for a small difference), and everything beyond the pinned
// pages (brought in layer after layer as far as the room goes) when even giving
// up every movable page would not make room for them.
BalancePlan plan_balance(const std::vector<std::vector<PagePlacement>>& pages, const std::vector<uint64_t>& n_tokens,
                         uint32_t page_tokens, uint64_t room);

}  // namespace ssa
