// The collectives of lib/shard/collective.h over NCCL, for one rank of a
// communicator the caller made (ncclCommInitRank per process, or
// ncclCommInitAll for the GPUs of one process). Each call is one NCCL collective
// on the rank's stream: all_reduce_sum -> ncclAllReduce(ncclUint64, ncclSum),
// all_reduce_max -> ncclAllReduce(ncclFloat32, ncclMax), all_gather ->
// ncclAllGather(ncclUint8). Buffers in device memory are used in place; host
// buffers (the CPU-side steps of the sharded selection) are staged through a
// device buffer of the collective's own. Every call waits for its stream, so it
// returns with the result in place, as the in-process collectives do. Results
// do not depend on NCCL's algorithm (integer sums, exact maxima), so all ranks
// hold bitwise the same values. NVLink multicast is the caller's to leave off
// (NCCL_NVLS_ENABLE=0 before the communicator is made).
//
// Built only in CUDA builds that find NCCL (target ssa_nccl_collective); the
// runtime does not use it yet (a CUDA runtime over several devices returns
// SSA_ERR_UNSUPPORTED), docs/SHARDING.md says what remains.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>

#include "absl/status/statusor.h"
#include "shard/collective.h"

namespace ssa {

class NcclCollective final : public Collective {
 public:
  // comm: this rank's ncclComm_t; stream: a cudaStream_t of the communicator's
  // device (null = the legacy default stream). Both stay the caller's and must
  // outlive the collective. Call with the communicator's device current.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> create(void* comm, void* stream);
  ~NcclCollective() override;

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  bool takes_device_buffers() const override { return true; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override;
  absl::Status all_reduce_max(float* data, size_t n) override;
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override;

 private:
  NcclCollective(void* comm, void* stream, int device, uint32_t rank, uint32_t size);
  absl::Status reduce(void* data, size_t n, size_t elem_bytes, int type, int op);
  absl::Status scratch(size_t bytes);  // device staging of at least `bytes`

  void* comm_;
  void* stream_;
  int device_;
  uint32_t rank_, size_;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace ssa
