// Asynchronous global -> shared copies (sm_80+ cp.async), shared by the kernels
// that stream K/V rows through a shared-memory ring.
#pragma once

#include <stdint.h>

namespace ssa::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; bytes = 0 writes zeros (positions past a split's
// end: their weight is 0 and must never meet uninitialised shared memory). The
// L2::128B hint lets L2 fetch the whole 128-byte line from DRAM at once: every
// caller streams rows of 128 bytes or more.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}
// An L2 policy that evicts the lines it tags first: for K/V rows read once per
// decode, which would otherwise push out of L2 what the next kernels reuse.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// cp_async16 with an L2 cache policy.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "l"(policy)
               : "memory");
}
// 4-byte global -> shared copy (cached in L1).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace ssa::cuda
