// Every host allocation of bulk session memory goes through here, so that tests
// can inject allocation failures (fail the n-th call) and check that each failure
// surfaces as SSA_ERR_OUT_OF_MEMORY with the session left unchanged.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace ssa {

// 64-byte aligned; nullptr on failure (or an injected failure).
void* aligned_alloc_or_null(size_t bytes);
void aligned_free(void* p);

// Test hook: the n-th allocation from now (1-based) and, if `sticky`, all later
// ones fail. 0 disables injection. Not thread-safe against concurrent setters.
void set_alloc_failure_countdown(uint64_t n, bool sticky);
uint64_t alloc_calls_made();

// One allocation under the hook: counts it and says whether it must fail.
// aligned_alloc_or_null() asks it; a test program can route every operator new
// through it too (tests/support/failing_new.cc), so that failures reach the
// small allocations of containers and control blocks as well.
bool alloc_should_fail();

}  // namespace ssa
