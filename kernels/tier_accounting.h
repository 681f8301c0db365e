// What a decode of a tiered session read from which tier (docs/TIERED_MEMORY.md):
// per item, the rows read over the bus from host pages and the rows of host
// pages read from their device copy, and per page how many sparse rows read it
// (the cache's admission signal). Plain descriptors, as decode_types.h.
#pragma once

#include <stdint.h>

#include <cuda_runtime.h>

#include "decode_types.h"

namespace ssa::cuda {

// A page's entry in a decode's tier table.
// kTierFile: a page mapped from a snapshot file; the kernels read it in place
// where the device reads pageable host memory, else through a pinned copy of the
// rows the decode reads (kernels/file_rows.h). Counted as host rows either way.
enum TierCode : uint8_t { kTierDevice = 0, kTierHost = 1, kTierCached = 2, kTierFile = 3 };

struct TierItem {
  const uint8_t* page_tier = nullptr;  // TierCode per KV page (device memory); null: nothing to count
  uint32_t* page_rows = nullptr;       // rows of sparse read sets per page (every tier), added to
  unsigned long long* counts = nullptr;  // [0] rows from host (and file) pages, [1] rows from cached copies, added
                                         // to; null: not counted
};

struct TierBatch {
  TierItem items[kMaxBatchItems];
};

// Queues the count over every (item, q head) read set of the decode that run_decode
// queued before it on `stream` (same b, workspace still live). Dense items count
// their rows but mark no page: a full scan says nothing about which rows are hot.
cudaError_t launch_tier_accounting(const DecodeBatch& b, const Workspace& ws, const TierBatch& t,
                                   cudaStream_t stream);

}  // namespace ssa::cuda
