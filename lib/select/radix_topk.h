// Top-k selection without a full sort: a radix histogram over the order-preserving
// bits of the float scores finds the bin holding the k-th largest value; only that
// bin's members are then ordered. O(n) and two passes over the scores. Output is
// unsorted (the estimator is order-free); among equal scores lower indices win,
// so the result is deterministic.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "common/host_device.h"

namespace ssa {

// Order-preserving map of a float's bits to an unsigned key (larger float, larger
// key); also the key of the CUDA sharded top-k (kernels/sharded_topk.cu).
SSA_HD uint32_t float_order_key(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
#endif
  // Negative: all bits flipped; positive: the sign bit set. Without branches (the
  // sign of a score is a coin flip, and a branch on it costs a misprediction per
  // element of the top-k passes).
  const uint32_t mask = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  const uint32_t key = u ^ (mask | 0x80000000u);
  return u == 0x80000000u ? 0x80000000u : key;  // -0.0 == +0.0: one key, so ties break by index
}

// The rounds of the sharded top-k (lib/shard/sharded_topk.cc on the CPU,
// kernels/sharded_topk.cu on the GPU): round r counts key bits
// [shift, shift + bits) of the keys whose higher bits match the rounds before.
inline constexpr int kShardedTopkRounds = 3;
SSA_HD constexpr int sharded_topk_shift(int round) { return round == 0 ? 20 : round == 1 ? 8 : 0; }
SSA_HD constexpr int sharded_topk_bits(int round) { return round < 2 ? 12 : 8; }

// Appends to *out the indices (offset by `base`) of the k largest of x[0..n).
// k >= n appends all.
void topk_indices(const float* x, size_t n, size_t k, uint32_t base, std::vector<uint32_t>* out);

}  // namespace ssa
