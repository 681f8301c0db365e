// The CUDA backend (lib/backend.h): sessions whose pages live in device memory
// (the library's stream-ordered pool, lib/cuda/device_alloc.h; never managed
// memory), appends from device pointers (or host pointers with
// SSA_SESSION_HOST_POINTERS), the PQ index trained and applied on the GPU, and
// decode / decode_batch through the kernels of kernels/.
//
// A CUDA session uses the same LayerStore as a CPU one: a Page's data pointer is a
// device address and its keeper returns it to the session's device page pool.
// Nothing here may read page bytes on the host.
//
// One idea per file, each defining its operations of CudaBackend:
//   device_state.{h,cc}  the session's device state, its table and codebook cache
//   device_append.cc     append: rows copied, scanned and encoded on the device
//   device_index.cc      the PQ index trained and encoded on the device
//   group_index_device.cc  the same for a rank of a group of processes
//   group_collective.{h,cc}  a group's collectives during a decode (staging)
//   launch_set.{h,cc}    decode: launch sets of items, and their stats
//   graph_step.{h,cc}    decode steps: reservations, and the step a CUDA graph
//                        captures (kernels/step_plan.h)
//   targeted_decode.cc   error-targeted decode: rounds of launch sets, per-head
//                        error estimates (kernels/error_estimate.cu)
//   device_checks.cc     devices, memory spaces, decode requests, snapshot staging
// and the pieces they share: device_alloc (the memory pool), device_pages (device
// page pools), device_mem (scoped device memory, page tables), device_error
// (CUDA errors as statuses), last_use (events of queued decodes), method_plan
// (decode requests as kernel knobs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "backend.h"
#include "store/kv_layout.h"

namespace ssa::cuda {

class CudaBackend final : public Backend {
 public:
  absl::Status check_device(int device) const override;
  absl::Status prepare_shard_devices(const std::vector<int32_t>& devices) const override;
  absl::Status reserve_host_pool(ssa_runtime& rt, uint64_t bytes) const override;
  absl::Status init_budget(ssa_runtime& rt) const override;
  absl::Status init_session(ssa_session& s) const override;
  absl::Status init_fork(const ssa_session& from, ssa_session& fork) const override;
  void session_destroyed(int device) const override;

  bool device_buffers() const override { return true; }
  absl::Status check_buffer(const ssa_session& s, const void* p, const char* name) const override;
  absl::Status copy_to_host(const ssa_session& s, const void* p, size_t bytes, void* out) const override;

  absl::Status prepare_append(const ssa_session& s, bool async, void* stream) const override;
  absl::Status gather_tail(ssa_session& s, LayerStore& layer, uint64_t new_n, bool codes,
                           LayerTail* tail) const override;
  absl::Status write_rows(ssa_session& s, const AppendRows& rows, const LayerStore& layer,
                          LayerTail& tail) const override;
  absl::Status train_index(ssa_session& s, LayerStore& layer) const override;
  absl::Status before_truncate(ssa_session& s, uint64_t n_tokens) const override;

  absl::Status check_decode(const ssa_session& s, uint32_t layer, const ssa_decode_params& p) const override;
  absl::Status decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index, const void* q,
                            void* out, const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats,
                            std::vector<HeadTrace>* traces, DecodeProfile* profile) const override;
  // The selection stays on the device: ssa_decode_traced is not served.
  bool records_traces() const override { return false; }
  absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                            const ssa_decode_params& p) const override;

  absl::Status check_reservable(const ssa_session& s) const override;
  absl::Status reserve_steps(ssa_session& s, uint64_t n_tokens) const override;
  absl::Status prefetch_turn(ssa_session& s, uint64_t n_tokens) const override;
  bool has_steps(const ssa_session& s) const override;
  absl::Status settle_steps(ssa_session& s, bool end, uint64_t* dropped) const override;
  absl::Status decode_steps(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                            const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats) const override;
  absl::Status check_eager_step(const ssa_decode_params& p) const override;

  absl::Status read_caller_buffer(const ssa_session& s, const void* p, size_t bytes, void* stream,
                                  void* host) const override;

  absl::StatusOr<PageRef> page_from_host(const ssa_session& s, bool kv, uint64_t page_index, size_t bytes,
                                         absl::FunctionRef<uint8_t*()> staging,
                                         absl::FunctionRef<absl::Status(uint8_t*)> fill) const override;
  absl::StatusOr<const uint8_t*> page_to_host(const ssa_session& s, const Page& page, size_t bytes,
                                              absl::FunctionRef<uint8_t*()> staging) const override;
};

// Queues the codes of tokens [begin, end) with device codebooks `books` on the
// legacy default stream; the caller waits (device_index.cc).
absl::Status encode_range(const ssa_session& s, const float* books, const std::vector<PageRef>& kv,
                          const std::vector<PageRef>& codes, uint64_t begin, uint64_t end);

struct DeviceMem;  // device_mem.h

// Codebooks of the layout's shape, zero, for a training to fill (device_index.cc).
std::shared_ptr<PqCodebooks> empty_codebooks(const KvLayout& L);

// The end of every device training: downloads the trained codebooks `bd`, waits
// for the encoding queued before, makes them the session's device copy and puts
// them and `codes` in the layer (device_index.cc).
absl::Status install_trained_index(ssa_session& s, LayerStore& layer, std::shared_ptr<PqCodebooks> books,
                                   DeviceMem&& bd, std::vector<PageRef> codes);

// A rank of a group of processes: codebooks trained on the sample gathered over
// the group (bitwise the unsharded session's), its own codes encoded
// (group_index_device.cc).
absl::Status train_group_index(ssa_session& s, LayerStore& layer);

}  // namespace ssa::cuda
