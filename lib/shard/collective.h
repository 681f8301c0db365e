// The collectives a sharded decode needs, as one rank of a group sees them
// (SPMD: every rank of the group calls the same operations in the same order,
// each with its own buffers). The CPU backend runs the ranks of a group as
// threads of one process (InProcessGroup, lib/shard/in_process_collective.h); an
// implementation over NCCL maps each call to one NCCL collective on the rank's
// communicator and stream (ncclAllReduce with ncclSum/ncclMax, ncclAllGather),
// with buffers in the rank's device memory. Results are independent of the
// reduction order: sums are of integers and maxima are exact, so every rank
// gets bitwise the same result whatever the transport's algorithm.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "absl/status/status.h"

namespace ssa {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;
  // Whether the buffers may be in device memory of the rank's device (NCCL);
  // if not, only host memory (the in-process collectives).
  virtual bool takes_device_buffers() const { return false; }
  // data[0..n) = the element-wise sum over the ranks (integers: exact).
  virtual absl::Status all_reduce_sum(uint64_t* data, size_t n) = 0;
  // data[0..n) = the element-wise maximum over the ranks (no NaN).
  virtual absl::Status all_reduce_max(float* data, size_t n) = 0;
  // recv[r * bytes ..] = rank r's send[0..bytes), for every rank r.
  virtual absl::Status all_gather(const void* send, size_t bytes, void* recv) = 0;
};

}  // namespace ssa
