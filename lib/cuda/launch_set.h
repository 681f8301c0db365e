// One launch set of the CUDA decode (launch_set.cc): jobs of one shape run as one
// pass of the kernel pipeline, with their stats. The error-targeted decode
// (targeted_decode.cc) runs its rounds through it.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "absl/status/status.h"
#include "decode/decode_plan.h"
#include "device_mem.h"
#include "kernels/decode_types.h"
#include "kernels/tier_accounting.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "targeted_rounds.h"
#include "ssa.h"

namespace ssa::cuda {

struct LaunchJob {
  const ssa_session* s;
  const LayerStore* layer;
  const void* q;
  void* out;
  DecodePlan plan;
};

// Work queued right after the pipeline, on its stream, while its workspace is
// alive (the error estimate of a round); record_draws asks the sampler for the
// draw lists it reads.
struct LaunchHook {
  virtual ~LaunchHook() = default;
  virtual bool record_draws() const { return false; }
  virtual cudaError_t after_decode(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                   cudaStream_t stream) = 0;
};

// stats (optional) summed over the jobs. Returns once the work is queued; with
// stats, staged (host) buffers or a hook, once it is done.
absl::Status run_launch_set(const std::vector<LaunchJob>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                            uint64_t seed, ssa_decode_stats* stats, LaunchHook* hook = nullptr);

// Adds a launch set's stats (one plan per item; rows: its row states read back,
// unless every item is dense; counts: tier counts per item, or empty).
void add_set_stats(const std::vector<DecodePlan>& plans, const DecodeBatch& b, const std::vector<RowState>& rows,
                   const std::vector<unsigned long long>& counts, const KvLayout& layout,
                   const ssa_decode_params& p, ssa_decode_stats* stats);

// Queues the tier count of a launch set's decode (kernels/tier_accounting.h) for
// the items of `tb` with a tier table (their page rows). With `counts` (stats
// wanted), also each item's rows per tier, 2 per item of n_items, copied back into
// *counts: valid once the stream has run, *device holding the device buffer
// until then.
cudaError_t queue_tier_counts(const DecodeBatch& b, const Workspace& ws, TierBatch& tb, uint32_t n_items,
                              cudaStream_t stream, DeviceMem* device, std::vector<unsigned long long>* counts);

// The jobs grouped into launch sets: jobs of one layout and pointer space (host
// or device q/out), up to kMaxBatchItems each, in the jobs' order.
std::vector<std::vector<LaunchJob>> launch_sets(const std::vector<LaunchJob>& jobs);

constexpr const char* kShardedMappedUnsupported =
    "a CUDA sharded session with pages mapped from a snapshot file (SSA_LOAD_MMAP) is not decoded in this "
    "version; load it without SSA_LOAD_MMAP";
constexpr const char* kShardedCaptureUnsupported =
    "a decode of a CUDA sharded session on a stream being captured into a CUDA graph: its shards exchange "
    "the selection through the host";
constexpr const char* kCapturedFileRows =
    "the stream is being captured into a CUDA graph, but the session's pages are mapped from a snapshot file "
    "this device cannot read: its decodes copy the rows they read on the host between the selection and the "
    "attention, which a graph cannot replay";

constexpr const char* kBatchNoErrorTarget =
    "ssa_decode_batch with target_error > 0 is not implemented by the CUDA backend (its rounds choose "
    "budgets per item); use ssa_decode per item or a fixed budget";

// Sessions of a runtime over several devices (sharded_decode.cc): the jobs (of
// sharded sessions of one runtime) decode as launch sets of up to kMaxBatchItems,
// each running a rank per shard that holds any of its items' tokens. Returns
// once the outputs' merges are queued on p.stream (with stats or host buffers,
// once they are done).
bool sharded_session(const ssa_session& s);
absl::Status sharded_decode(const std::vector<LaunchJob>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                            uint64_t seed, ssa_decode_stats* stats);

// Error-targeted decode of one (session, layer, query) (targeted_decode.cc).
absl::Status targeted_decode(const LaunchJob& job, uint32_t layer_index, const ssa_decode_params& p,
                             uint64_t seed, ssa_decode_stats* stats);

}  // namespace ssa::cuda
