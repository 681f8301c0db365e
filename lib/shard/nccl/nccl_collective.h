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
// No call hangs: each waits for its stream by polling, with a deadline of
// timeout_ms; when the deadline passes, or the communicator reports an
// asynchronous error (ncclCommGetAsyncError), the communicator is aborted
// (ncclCommAbort: a peer that failed or left leaves the others blocked in the
// collective otherwise) and the call returns SSA_ERR_IO, as does every later
// call. The caller must then not use or destroy the communicator.
//
// Built only in CUDA builds that find NCCL (SSA_HAVE_NCCL): the transport of a
// runtime made from a communicator (ssa_runtime_options.communicator,
// lib/shard/communicator_group.h).
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
  static absl::StatusOr<std::unique_ptr<NcclCollective>> create(void* comm, void* stream,
                                                                 uint32_t timeout_ms = 60000);
  // The same on a stream of its own (non-blocking, on the communicator's
  // device), destroyed with it.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> create_with_stream(void* comm, uint32_t timeout_ms);
  ~NcclCollective() override;
  int device() const { return device_; }

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  bool takes_device_buffers() const override { return true; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override;
  absl::Status all_reduce_max(float* data, size_t n) override;
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override;

 private:
  NcclCollective(void* comm, void* stream, int device, uint32_t rank, uint32_t size, uint32_t timeout_ms);
  absl::Status reduce(void* data, size_t n, size_t elem_bytes, int type, int op);
  absl::Status scratch(size_t bytes);  // device staging of at least `bytes`
  // Waits for the stream (the collective queued on it) within the deadline;
  // aborts the communicator on a timeout or an asynchronous error.
  absl::Status finish(const char* what);
  absl::Status aborted_error() const;

  void* comm_;
  void* stream_;
  int device_;
  uint32_t rank_, size_;
  uint32_t timeout_ms_;
  bool owns_stream_ = false;
  bool aborted_ = false;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace ssa
