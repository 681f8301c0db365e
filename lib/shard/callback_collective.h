// The collectives of a group of processes whose transport is the caller's
// (ssa_runtime_options.collective, docs/DISTRIBUTED.md): each operation of
// collective.h is one call of the caller's table, with the table's timeout.
// A failed call leaves the ranks out of step (they no longer agree on which
// collective comes next), so the group then refuses every later call at once
// instead of pairing one rank's exchange with another's.
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

  uint32_t rank() const override { return t_.rank; }
  uint32_t size() const override { return t_.size; }
  uint32_t timeout_ms() const { return t_.timeout_ms; }
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
  explicit ProcessGroup(const ssa_collective& t) : t_(t) {}
  absl::Status check(const char* op, int rc);

  const ssa_collective t_;
  std::atomic<bool> broken_{false};
  std::mutex call_mu_;
};

// A group runtime is a CPU runtime with one shard per rank: a CUDA backend
// (the NCCL path) or a devices list of more than one entry is refused.
absl::Status check_group_backend(const ssa_runtime_options& o, const std::vector<int32_t>& devices);

// Run at ssa_runtime_create by every rank: one all-gather that checks that the
// ranks number themselves 0..size-1, agree on the group's size, on
// shard_tokens and on this library's version (the estimator's bits depend on it).
absl::Status check_group_agreement(ProcessGroup& g, uint64_t shard_tokens);

}  // namespace ssa
