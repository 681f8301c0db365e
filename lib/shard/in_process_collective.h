// Collectives between the ranks of a group run as threads of one process (the
// CPU backend's shards). Each collective is two barriers: every rank publishes
// its buffer, every rank reads all of them in rank order into its own result,
// and only after the second barrier (nobody reads any more) writes it back. A
// rank that fails aborts the group: its peers' collectives then return an error
// instead of waiting for it.
#pragma once

#include <stdint.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "collective.h"

namespace ssa {

class InProcessGroup {
 public:
  // Throws std::bad_alloc (as the vectors it makes) when memory is short.
  explicit InProcessGroup(uint32_t n_ranks);

  // Runs body(comm) for every rank at once, rank 0 on the calling thread and the
  // others on threads of their own (a rank blocks in its collectives, so ranks
  // cannot share a thread pool's workers). Returns when all have returned: OK,
  // or the error of the lowest rank that failed by itself (not by an abort).
  absl::Status run(const std::function<absl::Status(Collective&)>& body);

 private:
  friend class InProcessCollective;
  // Waits until every rank has arrived; false if the group was aborted.
  bool barrier();
  void abort();

  const uint32_t n_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const void*> published_;  // one buffer per rank, for the collective in progress
  // Made up front: a rank that fails, or whose peer failed, reports them
  // without allocating (memory may be what ran out).
  const absl::Status aborted_status_, out_of_memory_;
};

}  // namespace ssa
