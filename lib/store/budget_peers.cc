#include "budget_peers.h"

#include <algorithm>

namespace ssa {

void BudgetPeers::join(ssa_session* s) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.push_back({s, 0});
}

void BudgetPeers::leave(ssa_session* s) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(), [&](const Entry& e) { return e.session == s; }),
                  sessions_.end());
}

void BudgetPeers::mark_active(ssa_session* s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : sessions_)
    if (e.session == s) e.active = ++tick_;
}

void BudgetPeers::visit_idle(const ssa_session* self, absl::FunctionRef<bool(ssa_session*)> visit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> order;
  for (const Entry& e : sessions_)
    if (e.session != self && e.active != 0) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) { return a.active < b.active; });
  for (const Entry& e : order)
    if (visit(e.session)) return;
}

size_t BudgetPeers::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace ssa
