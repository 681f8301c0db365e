// Replaces the global operator new/delete of the program it is linked into so
// that every C++ allocation - std::vector growth, shared_ptr control blocks,
// absl::Status messages, std::thread state - goes through the allocation failure
// hook of lib/alloc.h. Without it an injected failure reaches only the bulk
// page allocations, and the many small allocations around them (where the
// subtle error paths are) would never fail in a test. Link it only into test
// programs that inject failures: the hook costs an atomic per allocation.
#include <stdlib.h>

#include <new>

#include "alloc.h"

namespace {

void* allocate(size_t n) {
  if (ssa::alloc_should_fail()) return nullptr;
  return malloc(n == 0 ? 1 : n);
}

void* allocate_aligned(size_t n, std::align_val_t al) {
  if (ssa::alloc_should_fail()) return nullptr;
  const size_t a = static_cast<size_t>(al) < sizeof(void*) ? sizeof(void*) : static_cast<size_t>(al);
  const size_t rounded = (n + a - 1) / a * a;  // aligned_alloc wants a multiple of a
  return aligned_alloc(a, rounded == 0 ? a : rounded);
}

void* allocate_or_throw(size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}

void* allocate_aligned_or_throw(size_t n, std::align_val_t al) {
  if (void* p = allocate_aligned(n, al)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return allocate_or_throw(n); }
void* operator new[](size_t n) { return allocate_or_throw(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new(size_t n, std::align_val_t al) { return allocate_aligned_or_throw(n, al); }
void* operator new[](size_t n, std::align_val_t al) { return allocate_aligned_or_throw(n, al); }
void* operator new(size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return allocate_aligned(n, al);
}
void* operator new[](size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return allocate_aligned(n, al);
}

void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete(void* p, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { free(p); }
