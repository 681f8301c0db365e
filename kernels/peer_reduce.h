// Element-wise reductions over buffers of the ranks of a sharded decode, each in
// its own device's memory, read in place through peer access by a kernel on the
// reducing rank's device (lib/cuda/peer_collective.h): a collective that never
// leaves the devices.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace ssa::cuda {

constexpr uint32_t kMaxPeerBuffers = 64;  // as many as a runtime has shards

struct PeerBuffers {
  const void* src[kMaxPeerBuffers];
  uint32_t n = 0;
};

// dst[i] = the sum over r < in.n of in.src[r][i] (64-bit integers: exact), i < count.
cudaError_t peer_sum_u64(const PeerBuffers& in, uint64_t* dst, size_t count, cudaStream_t stream);
// dst[i] = the maximum over r of in.src[r][i] (floats, no NaN).
cudaError_t peer_max_f32(const PeerBuffers& in, float* dst, size_t count, cudaStream_t stream);

}  // namespace ssa::cuda
