// The rows a decode reads from pages mapped from a snapshot file, on a device
// that cannot read pageable host memory (docs/TIERED_MEMORY.md, "The file
// tier"): after the selection, one bit per (token, KV head) of each item's
// layer marks the rows its read sets take from file pages, so the host copies
// just those rows into pinned pages the attention then reads.
#pragma once

#include <stdint.h>

#include <cuda_runtime.h>

#include "decode_types.h"

namespace ssa::cuda {

struct FileRowItem {
  const uint8_t* page_tier = nullptr;  // TierCode per KV page (device memory); null: no file pages
  uint32_t* bits = nullptr;            // bit (t * n_kv_heads + kv head), zeroed before, ORed into
};

struct FileRowBatch {
  FileRowItem items[kMaxBatchItems];
};

// Queues the marking over every (item, q head) read set of the selection that
// run_selection queued before it on `stream` (same b, workspace still live).
cudaError_t launch_mark_file_rows(const DecodeBatch& b, const Workspace& ws, const FileRowBatch& m,
                                  cudaStream_t stream);

}  // namespace ssa::cuda
