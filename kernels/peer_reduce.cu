// The reductions of kernels/peer_reduce.h: a grid-stride loop, each element
// reduced over the ranks in rank order.
#include <algorithm>

#include "peer_reduce.h"

namespace ssa::cuda {
namespace {

template <typename T, typename Op>
__global__ void __launch_bounds__(256) peer_reduce_kernel(PeerBuffers in, T* dst, size_t count, Op op) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    T v = static_cast<const T*>(in.src[0])[i];
    for (uint32_t r = 1; r < in.n; ++r) v = op(v, static_cast<const T*>(in.src[r])[i]);
    dst[i] = v;
  }
}

struct Sum {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
cudaError_t launch(const PeerBuffers& in, T* dst, size_t count, cudaStream_t stream) {
  if (in.n == 0 || in.n > kMaxPeerBuffers) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((count + 255) / 256, 4096));
  peer_reduce_kernel<<<blocks, 256, 0, stream>>>(in, dst, count, Op{});
  return cudaGetLastError();
}

}  // namespace

cudaError_t peer_sum_u64(const PeerBuffers& in, uint64_t* dst, size_t count, cudaStream_t stream) {
  return launch<uint64_t, Sum>(in, dst, count, stream);
}

cudaError_t peer_max_f32(const PeerBuffers& in, float* dst, size_t count, cudaStream_t stream) {
  return launch<float, Max>(in, dst, count, stream);
}

}  // namespace ssa::cuda
