#include "alloc.h"

#include <stdlib.h>

#include "fault_countdown.h"

namespace ssa {
namespace {
FaultCountdown g_faults;
}  // namespace

bool alloc_should_fail() { return g_faults.fire(); }

void* aligned_alloc_or_null(size_t bytes) {
  if (alloc_should_fail()) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  return ::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

void aligned_free(void* p) { ::free(p); }

void set_alloc_failure_countdown(uint64_t n, bool sticky) { g_faults.arm(n, sticky); }

uint64_t alloc_calls_made() { return g_faults.calls(); }

}  // namespace ssa
