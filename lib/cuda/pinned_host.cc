#include "pinned_host.h"

#include <stdint.h>
#include <sys/mman.h>

namespace ssa::cuda {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t v) { return (v + kHugePage - 1) / kHugePage * kHugePage; }

}  // namespace

cudaError_t pin_host(size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return cudaErrorInvalidValue;
  const size_t size = round_up(bytes);
  // Over-map by one huge page and trim both ends, so the range is 2 MiB-aligned.
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return cudaErrorMemoryAllocation;
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (r + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (base > r) munmap(raw, base - r);
  if (r + kHugePage > base) munmap(reinterpret_cast<void*>(base + size), r + kHugePage - base);
  void* p = reinterpret_cast<void*>(base);
  // Only advice: where the kernel has no huge pages to give, 4 KiB pages serve.
  madvise(p, size, MADV_HUGEPAGE);
  // A forked child gets none of it (as with the driver's own pinned memory): no
  // copy of the tier at fork, no copy-on-write page under a device's reads.
  madvise(p, size, MADV_DONTFORK);
  const cudaError_t e = cudaHostRegister(p, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    munmap(p, size);
    return e;
  }
  *out = p;
  return cudaSuccess;
}

void unpin_host(void* p, size_t bytes) {
  if (p == nullptr) return;
  cudaHostUnregister(p);
  munmap(p, round_up(bytes));
}

}  // namespace ssa::cuda
