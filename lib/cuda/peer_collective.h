// The collectives of a sharded CUDA decode's ranks, threads of one process each
// on its own device: host buffers go to the group's host collectives
// (lib/shard/in_process_collective.h); device buffers stay on the devices, each
// rank's kernel reading its peers' buffers in place (peer access,
// kernels/peer_reduce.h), so that the top-k's histograms never cross to the
// host. Each device collective is the in-process pattern over device memory:
// every rank's buffer complete and published (a barrier), every rank reads all
// of them into its own scratch, a second barrier (nobody reads any more), then
// the write-back, queued on the rank's stream. Every rank passes the same kind
// of buffer (host or device) to the same call.
#pragma once

#include <cuda_runtime.h>

#include "shard/collective.h"

namespace ssa::cuda {

class PeerCollective : public Collective {
 public:
  // host: this rank's host collectives; stream: the rank's, on the current device.
  PeerCollective(Collective& host, cudaStream_t stream) : host_(host), stream_(stream) {}
  uint32_t rank() const override { return host_.rank(); }
  uint32_t size() const override { return host_.size(); }
  bool takes_device_buffers() const override { return true; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override;
  absl::Status all_reduce_max(float* data, size_t n) override;
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override;

 private:
  // Every rank's pointer p (a barrier); false if p is host memory.
  absl::Status publish(const void* p, std::vector<const void*>* all);
  absl::Status barrier();
  template <typename T, typename Reduce>
  absl::Status all_reduce(T* data, size_t n, Reduce reduce);

  Collective& host_;
  cudaStream_t stream_;
};

}  // namespace ssa::cuda
