// The global top-k of candidates spread over the shards of a group, each shard's
// scores in its device's memory: the set lib/shard/sharded_topk.h finds on the
// CPU (the k largest by float_order_key, ties to the lowest tokens), marked in a
// bitmap per row, with no score leaving its device. Per call: three rounds of a
// histogram kernel and an all-reduce of rows x 4096 (the last 256) counts, one
// all-gather of rows counts of ties, and a marking pass (kernels/sharded_topk.h).
// SPMD, as every collective: each rank calls it with the same rows, k and
// n_global, its own scores.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "kernels/sharded_topk.h"
#include "shard/collective.h"

namespace ssa::cuda {

// k[row]: how many of the row's n_global[row] candidates (over all shards) the
// set takes. bits: device memory, rows x (rows_in.n + 31) / 32 words, written on
// `stream`; complete when the call returns. Device buffers go to the collective
// where it takes them (Collective::takes_device_buffers), else through the host.
absl::Status device_sharded_topk(Collective& comm, const ShardTopkRows& rows_in, const std::vector<uint64_t>& k,
                                 const std::vector<uint64_t>& n_global, cudaStream_t stream, uint32_t* bits);
// Every row with n_global candidates.
absl::Status device_sharded_topk(Collective& comm, const ShardTopkRows& rows_in, const std::vector<uint64_t>& k,
                                 uint64_t n_global, cudaStream_t stream, uint32_t* bits);

}  // namespace ssa::cuda
