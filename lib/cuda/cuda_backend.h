// The CUDA backend behind the C API: device sessions whose pages live in device
// memory (the library's stream-ordered pool, lib/cuda/device_alloc.h; never managed
// memory), appends from device pointers (or host
// pointers with SSA_SESSION_HOST_POINTERS), the PQ index trained and applied on
// the GPU, and decode / decode_batch through the kernels of kernels/.
//
// A CUDA session uses the same LayerStore as a CPU one: a Page's data pointer is a
// device address and its keeper returns it to the session's device page pool.
// Nothing here may read page bytes on the host.
//
// Without the CUDA compiler these functions exist and report SSA_ERR_UNSUPPORTED.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ssa.h"
#include "store/layer_store.h"

struct ssa_session;

namespace ssa::cuda {

struct SessionState;

// OK when `device` is a usable CUDA device; SSA_ERR_DEVICE / SSA_ERR_UNSUPPORTED else.
absl::Status check_device(int device);
bool device_available(int device);

// Sets up the device state of a new (or loaded) CUDA session.
absl::Status init_session(ssa_session& s);
// Device state of a fork: shares the page pools, caches nothing.
absl::StatusOr<std::shared_ptr<SessionState>> fork_state(const SessionState& st);

// The CUDA versions of session mutations (same contracts as session.h).
absl::Status session_append(ssa_session& s, uint32_t layer, const void* k, const void* v,
                            uint64_t n_tokens);
// ssa_session_append_async for CUDA sessions with device pointers (stream: a
// cudaStream_t).
absl::Status session_append_async(ssa_session& s, uint32_t layer, const void* k, const void* v,
                                  uint64_t n_tokens, void* stream);
// Refuses a stream being captured into a graph, then waits for it (an
// asynchronous append that appends as ssa_session_append).
absl::Status wait_for_stream(void* stream);
absl::Status retrain_layer(ssa_session& s, LayerStore& layer);
// Before a truncation to n_tokens: waits for the session's queued decodes that
// read more tokens (rows an append may rewrite next), and for no other work.
absl::Status wait_for_readers_beyond(ssa_session& s, uint64_t n_tokens);

// After a CUDA session on `device` was destroyed: gives the memory the library's
// device pool keeps unused back to the driver.
void release_unused_memory(int device);

// Snapshot staging of CUDA sessions: the bytes of a device page copied to host
// memory (dst holds `bytes`), and a new device page of the session's KV (kv) or
// code pool filled from host bytes. Snapshot files hold the same bytes for both
// backends, so a snapshot saved from either loads on the other.
absl::Status copy_page_to_host(const ssa_session& s, const Page& page, size_t bytes, uint8_t* dst);
absl::StatusOr<PageRef> page_from_host(const ssa_session& s, bool kv, const uint8_t* src, size_t bytes);

// Decode of one layer (reader lock held by the caller).
absl::Status decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                          const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                          ssa_decode_stats* stats);

// decode_batch for CUDA sessions: items grouped by shape into launch sets of up to
// 32 items of any lengths. Items were validated by the caller.
absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                          const ssa_decode_params& p);

}  // namespace ssa::cuda
