#include "alloc.h"

#include <stdlib.h>

#include <atomic>

namespace ssa {
namespace {
std::atomic<uint64_t> g_countdown{0};
std::atomic<bool> g_sticky{false};
std::atomic<bool> g_failing{false};
std::atomic<uint64_t> g_calls{0};
}  // namespace

bool alloc_should_fail() {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_failing.load(std::memory_order_relaxed)) return true;
  uint64_t c = g_countdown.load(std::memory_order_relaxed);
  while (c != 0) {
    if (g_countdown.compare_exchange_weak(c, c - 1, std::memory_order_relaxed)) {
      if (c == 1) {
        if (g_sticky.load(std::memory_order_relaxed)) g_failing.store(true);
        return true;
      }
      return false;
    }
  }
  return false;
}

void* aligned_alloc_or_null(size_t bytes) {
  if (alloc_should_fail()) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  return ::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

void aligned_free(void* p) { ::free(p); }

void set_alloc_failure_countdown(uint64_t n, bool sticky) {
  g_failing.store(false);
  g_sticky.store(sticky);
  g_countdown.store(n);
}

uint64_t alloc_calls_made() { return g_calls.load(); }

}  // namespace ssa
