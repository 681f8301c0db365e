// A countdown that makes the n-th call of some operation fail (and, if sticky,
// every later one): the test hook behind injected allocation failures.
#pragma once

#include <stdint.h>

#include <atomic>

namespace ssa {

class FaultCountdown {
 public:
  // The n-th fire() from now (1-based) returns true; n = 0 disarms.
  void arm(uint64_t n, bool sticky) {
    failing_.store(false);
    sticky_.store(sticky);
    countdown_.store(n);
  }

  // Counts the call; true when this call is to fail.
  bool fire() {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (failing_.load(std::memory_order_relaxed)) return true;
    uint64_t c = countdown_.load(std::memory_order_relaxed);
    while (c != 0) {
      if (countdown_.compare_exchange_weak(c, c - 1, std::memory_order_relaxed)) {
        if (c == 1 && sticky_.load(std::memory_order_relaxed)) failing_.store(true);
        return c == 1;
      }
    }
    return false;
  }

  uint64_t calls() const { return calls_.load(); }

 private:
  std::atomic<uint64_t> countdown_{0};
  std::atomic<bool> sticky_{false};
  std::atomic<bool> failing_{false};
  std::atomic<uint64_t> calls_{0};
};

}  // namespace ssa
