// Sessions taking turns trade the device budget (docs/TIERED_MEMORY.md,
// "Sessions taking turns"): when a tiered session reserves decode steps, the
// runtime's idle sessions give up device pages, least recently active session
// and least recently read page first, and the reserving session brings its
// host pages in. Each host row then crosses the bus once per turn, where read in
// place it would cross once per step that reads it. A page brought in keeps its
// host page while unwritten, so giving it up again copies nothing.
#pragma once

#include "absl/status/status.h"

struct ssa_session;

namespace ssa::cuda {

// Before a reservation of n_tokens by tiered session `s` (held exclusively):
// makes room for its host pages and the reservation's new pages by moving idle
// peers' movable device pages to their host tiers (a peer is idle when its lock
// is free and it holds no reservation: a reservation's steps read the tables it
// froze), then brings its host pages to the device as far as the budget allows
// with room left for the new pages, pinned pages first, then the most recently
// read. Contents are unchanged; a move that
// cannot be made (no room, no host memory) is skipped; only device errors are
// returned.
absl::Status take_turn(ssa_session& s, uint64_t n_tokens);

// The same turn started ahead, for a session that is to reserve next while
// another decodes (ssa_session_prefetch): idle peers give up pages as above, and
// `s`'s host pages are copied to device blocks on a stream of its own, queued
// and not waited for. Its layers keep the host pages until it takes the copies
// in: at its next turn (take_turn waits for them), or a later start. A page
// written or shared meanwhile (copy-on-write gives the layer another page) is
// left on the host. Giving up an idle session's pages first drops its copies in
// flight (after they have landed). Nothing for a session holding a reservation.
absl::Status start_turn(ssa_session& s, uint64_t n_tokens);

}  // namespace ssa::cuda
