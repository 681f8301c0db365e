// The sessions of a runtime with a device budget that trade it (CUDA sessions
// of one device, docs/TIERED_MEMORY.md "Sessions taking turns"): a session
// about to decode asks the others, least recently active first, to give up
// device pages for its own. Host-only bookkeeping; the moves are the
// backend's (lib/cuda/budget_trade.h).
#pragma once

#include <stdint.h>

#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"

struct ssa_session;

namespace ssa {

class BudgetPeers {
 public:
  // A session joins at creation (or fork) and leaves before it is destroyed;
  // leave() waits for a visit that is under way, so a visitor never sees a
  // session being destroyed.
  void join(ssa_session* s);
  void leave(ssa_session* s);
  // `s` is the session decoding now (the most recently active).
  void mark_active(ssa_session* s);
  // Calls visit(peer) for every other session that has been active (a session
  // still being created or loaded never has), least recently active first,
  // until it returns true; the peers cannot leave meanwhile. The visitor must
  // not block on a peer's lock (try it; a session busy elsewhere is not idle).
  void visit_idle(const ssa_session* self, absl::FunctionRef<bool(ssa_session*)> visit);
  size_t size() const;

 private:
  struct Entry {
    ssa_session* session;
    uint64_t active;  // tick of its last mark_active (0: never)
  };
  mutable std::mutex mu_;
  std::vector<Entry> sessions_;
  uint64_t tick_ = 0;
};

}  // namespace ssa
