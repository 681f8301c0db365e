// The collectives of a decode on a rank of a group of processes, as the
// sharded CUDA decode's stages call them (sharded_work.h): host buffers go to
// the group as they are; device buffers (the top-k's histograms, the mixture's
// sums, the adaptive rule's keys, the partial outputs) go in place to a group
// whose transport takes them (NCCL), after the rank's stream has written them,
// and through host memory to one that does not (the caller's callbacks).
// Every call returns with the result in place (the stream may go on).
#pragma once

#include <cuda_runtime.h>

#include "shard/callback_collective.h"
#include "shard/collective.h"

namespace ssa::cuda {

class GroupDeviceCollective final : public Collective {
 public:
  // stream: the rank's decode stream, on the current device.
  GroupDeviceCollective(ProcessGroup& group, cudaStream_t stream) : g_(group), stream_(stream) {}
  uint32_t rank() const override { return g_.rank(); }
  uint32_t size() const override { return g_.size(); }
  bool takes_device_buffers() const override { return true; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override;
  absl::Status all_reduce_max(float* data, size_t n) override;
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override;

 private:
  ProcessGroup& g_;
  cudaStream_t stream_;
};

}  // namespace ssa::cuda
