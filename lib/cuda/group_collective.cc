#include "group_collective.h"

#include <stdint.h>

#include <vector>

#include "device_error.h"
#include "device_mem.h"
#include "status.h"

namespace ssa::cuda {
namespace {

// A device buffer's reduction through host memory: read back once the stream
// wrote it, reduced by the group, written back and waited for (the host copy
// goes out of scope).
template <typename T, typename Op>
absl::Status staged_reduce(cudaStream_t stream, T* data, size_t n, Op op) {
  std::vector<T> host(n);
  if (n != 0) {
    SSA_CUDA_RETURN(cudaMemcpyAsync(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost, stream),
                    "collective read-back");
  }
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "collective read-back");
  SSA_RETURN_IF_ERROR(op(host.data()));
  if (n == 0) return absl::OkStatus();
  SSA_CUDA_RETURN(cudaMemcpyAsync(data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream),
                  "collective upload");
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "collective upload");
  return absl::OkStatus();
}

}  // namespace

absl::Status GroupDeviceCollective::all_reduce_sum(uint64_t* data, size_t n) {
  if (!is_device_memory(data)) return g_.all_reduce_sum(data, n);
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream_), "collective ordering");
  if (g_.takes_device_buffers()) return g_.all_reduce_sum(data, n);
  return staged_reduce(stream_, data, n, [&](uint64_t* h) { return g_.all_reduce_sum(h, n); });
}

absl::Status GroupDeviceCollective::all_reduce_max(float* data, size_t n) {
  if (!is_device_memory(data)) return g_.all_reduce_max(data, n);
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream_), "collective ordering");
  if (g_.takes_device_buffers()) return g_.all_reduce_max(data, n);
  return staged_reduce(stream_, data, n, [&](float* h) { return g_.all_reduce_max(h, n); });
}

absl::Status GroupDeviceCollective::all_gather(const void* send, size_t bytes, void* recv) {
  const bool dev_send = is_device_memory(send), dev_recv = is_device_memory(recv);
  if (!dev_send && !dev_recv) return g_.all_gather(send, bytes, recv);
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream_), "collective ordering");
  if (g_.takes_device_buffers()) return g_.all_gather(send, bytes, recv);
  std::vector<uint8_t> in, out(bytes * g_.size());
  const void* host_send = send;
  if (dev_send) {
    in.resize(bytes);
    if (bytes != 0) SSA_CUDA_RETURN(cudaMemcpy(in.data(), send, bytes, cudaMemcpyDeviceToHost), "collective read-back");
    host_send = in.data();
  }
  SSA_RETURN_IF_ERROR(g_.all_gather(host_send, bytes, dev_recv ? out.data() : recv));
  if (dev_recv && !out.empty()) {
    SSA_CUDA_RETURN(cudaMemcpyAsync(recv, out.data(), out.size(), cudaMemcpyHostToDevice, stream_),
                    "collective upload");
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream_), "collective upload");
  }
  return absl::OkStatus();
}

}  // namespace ssa::cuda
