// The collectives of a group of processes whose transport is the caller's
// (docs/DISTRIBUTED.md): each operation of collective.h is one call of the
// transport, with its timeout. The transport is the caller's table of
// callbacks (ssa_runtime_options.collective, host buffers only) or the
// caller's NCCL communicator (ssa_runtime_options.communicator, through
// lib/shard/nccl: device buffers in place); the group above it, its summary
// exchanges, training agreement and snapshots are the same code for both, on
// CPU and CUDA runtimes. A failed call leaves the ranks out of step (they no
// longer agree on which collective comes next), so the group then refuses
// every later call at once instead of pairing one rank's exchange with another's.
#pragma once

#include <stdint.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collective.h"
#include "ssa.h"

namespace ssa {

class ProcessGroup final : public Collective {
 public:
  // Checks the caller's table (struct_size, rank < size <= kMaxShards, every
  // callback set, timeout > 0) and copies it.
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> create(const ssa_collective* table);
  // A group over another transport (rank and size are its own, size <=
  // kMaxShards), which applies timeout_ms to every call itself and returns
  // an error (never hangs) when a peer fails; `what` names it in errors.
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> over(std::unique_ptr<Collective> transport,
                                                            uint32_t timeout_ms, const char* what);

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  uint32_t timeout_ms() const { return timeout_ms_; }
  // Whether device buffers (of the runtime's device) go to the transport in
  // place (NCCL); else they must be staged through host memory by the caller.
  bool takes_device_buffers() const override { return transport_->takes_device_buffers(); }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override;
  absl::Status all_reduce_max(float* data, size_t n) override;
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override;

  // Held for the whole of one collective call of the library (a decode): the
  // threads of one process that share the runtime take turns, so that one
  // call's exchanges are never interleaved with another's. Ranks must still
  // make their calls in the same order.
  std::mutex& call_mutex() { return call_mu_; }

  // After this rank left a collective call part way (its own error, after some
  // exchanges): its peers are waiting for exchanges it will not make, so the
  // group refuses every later call, as after a failed callback.
  void mark_out_of_step() { broken_.store(true); }
  bool out_of_step() const { return broken_.load(); }

 private:
  ProcessGroup(std::unique_ptr<Collective> transport, uint32_t timeout_ms, const char* what);
  absl::Status check(const char* op, absl::Status st);
  absl::Status broken_error() const;

  const std::unique_ptr<Collective> transport_;
  const uint32_t rank_, size_, timeout_ms_;
  const char* const what_;
  std::atomic<bool> broken_{false};
  std::mutex call_mu_;
};

// A group runtime holds one shard per rank on one device: a devices list of
// more than one entry is refused, and for the CUDA backend a device budget
// (tiers) too.
absl::Status check_group_backend(const ssa_runtime_options& o, const std::vector<int32_t>& devices);

// Run at ssa_runtime_create by every rank: one all-gather that checks that the
// ranks number themselves 0..size-1, agree on the group's size, on
// shard_tokens, on the backend (CPU and CUDA ranks make other exchanges) and on
// this library's version (the estimator's bits depend on it).
absl::Status check_group_agreement(ProcessGroup& g, uint64_t shard_tokens, ssa_backend backend);

}  // namespace ssa
