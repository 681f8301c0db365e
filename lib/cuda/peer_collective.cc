#include "peer_collective.h"

#include <stdint.h>

#include <vector>

#include "device_error.h"
#include "device_mem.h"
#include "kernels/peer_reduce.h"
#include "status.h"

namespace ssa::cuda {

absl::Status PeerCollective::publish(const void* p, std::vector<const void*>* all) {
  // Whatever the stream queued into the buffer is complete before a peer reads it.
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream_), "collective ordering");
  const uint64_t mine = reinterpret_cast<uintptr_t>(p);
  std::vector<uint64_t> ptrs(size());
  SSA_RETURN_IF_ERROR(host_.all_gather(&mine, sizeof mine, ptrs.data()));
  all->resize(size());
  for (uint32_t r = 0; r < size(); ++r) (*all)[r] = reinterpret_cast<const void*>(static_cast<uintptr_t>(ptrs[r]));
  return absl::OkStatus();
}

absl::Status PeerCollective::barrier() {
  uint64_t none = 0;
  std::vector<uint64_t> all(size());
  return host_.all_gather(&none, sizeof none, all.data());
}

template <typename T, typename Reduce>
absl::Status PeerCollective::all_reduce(T* data, size_t n, Reduce reduce) {
  if (size() > kMaxPeerBuffers) return unsupported("device collectives over more than ", kMaxPeerBuffers, " ranks");
  std::vector<const void*> all;
  SSA_RETURN_IF_ERROR(publish(data, &all));
  PeerBuffers in;
  in.n = size();
  for (uint32_t r = 0; r < in.n; ++r) in.src[r] = all[r];
  DeviceMem scratch;
  cudaError_t e = scratch.alloc(n * sizeof(T), stream_);
  if (e == cudaSuccess) e = reduce(in, static_cast<T*>(scratch.p), n, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  // Also after a failure here: the peers may be reading this rank's data, which
  // the caller frees on its way out.
  const absl::Status read = barrier();
  SSA_CUDA_RETURN(e, "peer reduction");
  SSA_RETURN_IF_ERROR(read);
  SSA_CUDA_RETURN(cudaMemcpyAsync(data, scratch.p, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                  "collective write-back");
  return absl::OkStatus();
}

absl::Status PeerCollective::all_reduce_sum(uint64_t* data, size_t n) {
  if (!is_device_memory(data)) return host_.all_reduce_sum(data, n);
  return all_reduce(data, n, peer_sum_u64);
}

absl::Status PeerCollective::all_reduce_max(float* data, size_t n) {
  if (!is_device_memory(data)) return host_.all_reduce_max(data, n);
  return all_reduce(data, n, peer_max_f32);
}

absl::Status PeerCollective::all_gather(const void* send, size_t bytes, void* recv) {
  if (!is_device_memory(send)) return host_.all_gather(send, bytes, recv);
  std::vector<const void*> all;
  SSA_RETURN_IF_ERROR(publish(send, &all));
  cudaError_t e = cudaSuccess;
  for (uint32_t r = 0; r < size() && e == cudaSuccess; ++r)
    e = cudaMemcpyAsync(static_cast<uint8_t*>(recv) + r * bytes, all[r], bytes, cudaMemcpyDefault, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  const absl::Status read = barrier();  // every peer has read this rank's buffer
  SSA_CUDA_RETURN(e, "collective gather");
  return read;
}

}  // namespace ssa::cuda
