// Decodes of sessions whose K/V pages are mapped from a snapshot file
// (SSA_LOAD_MMAP) on a device that cannot read pageable host memory
// (cudaDevAttrPageableMemoryAccess 0; docs/TIERED_MEMORY.md, "The file tier").
// The kernels cannot read the mapping, so the decode runs in two parts: the
// selection, then, once the read sets are known, the host copies exactly the
// rows they take from file pages into pinned pages mapped for the device, at
// their places in the page, and the attention reads those through a page table
// in which they stand for the file pages. The exact proxy (ORACLE_TOPK) scores
// every key, so it stages whole pages before the selection instead.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "device_state.h"
#include "kernels/decode_types.h"
#include "session.h"

namespace ssa::cuda {

// One item of a launch set whose tables have file pages the device cannot read.
struct FileStageItem {
  uint32_t item = 0;  // index in the DecodeBatch
  const ssa_session* s = nullptr;
  const LayerStore* layer = nullptr;
  const SessionState::LayerCache* tables = nullptr;
};

// What the staged attention reads: alive until the decode has run.
struct FileStage {
  std::vector<PageRef> pinned;
  std::vector<std::unique_ptr<DeviceMem>> tables;
  DeviceMem bits;
  uint64_t rows_copied = 0;  // (token, KV head) rows copied, K and V
};

// Whether decodes of the session's layer must stage the rows they read from file
// pages (the layer has some, and the device cannot read them in place).
bool stages_file_rows(const ssa_session& s, const LayerStore& layer);

// Copies what the items read from their file pages into pinned pages and points
// each item's kv_pages at a table that reads them. ws null: whole pages, before
// the selection; else the rows of the read sets run_selection left in ws, which
// this waits for (stream). Fails with SSA_ERR_OUT_OF_MEMORY when no pinned page
// can be had, leaving b unchanged.
absl::Status stage_file_rows(const std::vector<FileStageItem>& items, DecodeBatch* b, const Workspace* ws,
                             cudaStream_t stream, FileStage* out);

// The layer's pages with every file page the device cannot read replaced by a
// pinned copy of it (index training reads every key): the layer's own pages
// where there is none. The copies live as long as the returned references.
absl::StatusOr<std::vector<PageRef>> readable_pages(const ssa_session& s, const LayerStore& layer);

}  // namespace ssa::cuda
