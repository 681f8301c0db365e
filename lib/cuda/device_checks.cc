// Devices, memory spaces, decode requests the kernels cannot serve, and the
// host staging of pages for snapshot files.
#include <cuda_runtime.h>
#include <string.h>

#include <shared_mutex>

#include "cuda_backend.h"
#include "device_alloc.h"
#include "device_error.h"
#include "device_guard.h"
#include "device_mem.h"
#include "device_state.h"
#include "device_tiers.h"
#include "file_staging.h"
#include "launch_set.h"

namespace ssa::cuda {
absl::Status CudaBackend::check_device(int device) const {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return make_error(SSA_ERR_DEVICE, absl::StrCat("no usable CUDA device: ",
                                                   e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
  }
  if (device < 0 || device >= n) {
    return make_error(SSA_ERR_DEVICE, absl::StrCat("CUDA device ", device, " does not exist (", n, " found)"));
  }
  return absl::OkStatus();
}

// Every shard's device must read every other's memory: appends and index
// training run on the first device and write the pages of every shard, and the
// shards' partial outputs are copied to the first device. Peer access is
// enabled once per pair of distinct devices, for the life of the process.
absl::Status CudaBackend::prepare_shard_devices(const std::vector<int32_t>& devices) const {
  for (const int32_t d : devices) SSA_RETURN_IF_ERROR(check_device(d));
  for (const int32_t a : devices) {
    for (const int32_t b : devices) {
      if (a == b) continue;
      int can = 0;
      SSA_CUDA_RETURN(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
      if (can == 0) {
        return unsupported("CUDA devices ", a, " and ", b, " cannot access each other's memory (peer access), "
                           "which a runtime sharding sessions over both needs");
      }
      const DeviceGuard on(a);
      SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        SSA_CUDA_RETURN(e, "cudaDeviceEnablePeerAccess");
      }
      SSA_CUDA_RETURN(device_pool_share(b), "cudaMemPoolSetAccess");
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::check_buffer(const ssa_session& s, const void* p, const char* name) const {
  if (host_buffers(s) || is_device_memory(p)) return absl::OkStatus();
  return invalid_argument(name, " is not a device pointer (a CUDA session takes device memory; "
                          "create it with SSA_SESSION_HOST_POINTERS to pass host memory)");
}

// Device memory is read on the legacy default stream (after the work queued
// there, as a synchronous append reads its rows), with the session's device current.
absl::Status CudaBackend::copy_to_host(const ssa_session& s, const void* p, size_t bytes, void* out) const {
  if (host_buffers(s)) {
    memcpy(out, p, bytes);
    return absl::OkStatus();
  }
  const DeviceGuard on(state(s).device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  SSA_CUDA_RETURN(cudaMemcpy(out, p, bytes, cudaMemcpyDeviceToHost), "query copy to the host");
  return absl::OkStatus();
}

// What the decode paths would refuse once they run (targeted_decode.cc,
// sharded_decode.cc, launch_set.cc), refused here first, before an index is
// trained for the decode: an error-targeted decode waits on the host between
// its rounds, a sharded one exchanges its selection through the host, and rows
// of file pages this device cannot read are copied by the host mid-decode; a
// stream being captured into a graph could replay none of these. Sharded
// sessions do not decode file pages at all.
absl::Status CudaBackend::check_decode(const ssa_session& s, uint32_t layer_index,
                                       const ssa_decode_params& p) const {
  const bool sharded = sharded_session(s);
  bool mapped = false, file_rows = false;
  {
    std::shared_lock lock(s.mu);
    const LayerStore& layer = s.layers[layer_index];
    mapped = sharded && layer_has_host_pages(layer);
    file_rows = stages_file_rows(s, layer);
  }
  if (mapped) return unsupported(kShardedMappedUnsupported);
  if (!(p.target_error > 0.0f) && !sharded && !file_rows) return absl::OkStatus();
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(static_cast<cudaStream_t>(p.stream), &cap), "cudaStreamIsCapturing");
  if (cap == cudaStreamCaptureStatusNone) return absl::OkStatus();
  if (p.target_error > 0.0f) {
    return invalid_argument("target_error > 0 on a stream being captured into a CUDA graph: the "
                            "error-targeted decode reads its per-head estimates back between rounds");
  }
  if (sharded) return unsupported(kShardedCaptureUnsupported);
  return invalid_argument(kCapturedFileRows);
}

absl::Status CudaBackend::read_caller_buffer(const ssa_session& s, const void* p, size_t bytes, void* stream,
                                             void* host) const {
  if (host_buffers(s)) {
    memcpy(host, p, bytes);
    return absl::OkStatus();
  }
  SSA_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "caller's stream");
  SSA_CUDA_RETURN(cudaMemcpy(host, p, bytes, cudaMemcpyDeviceToHost), "caller buffer read-back");
  return absl::OkStatus();
}

absl::StatusOr<PageRef> CudaBackend::page_from_host(const ssa_session& s, bool kv, uint64_t page_index,
                                                    size_t bytes, absl::FunctionRef<uint8_t*()> staging,
                                                    absl::FunctionRef<absl::Status(uint8_t*)> fill) const {
  SessionState& st = shard_state(s, shard_of_page(s, page_index));
  const DeviceGuard on(st.device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  absl::StatusOr<PageRef> page = kv ? st.kv_pool->allocate() : st.code_pool->allocate();
  if (!page.ok()) return page.status();
  if ((*page)->bytes() < bytes) return make_error(SSA_ERR_INTERNAL, "page is shorter than its layout");
  if ((*page)->tier() == PageTier::kHost) {
    // A host-tier page (beyond the device budget) is host memory: filled in place.
    SSA_RETURN_IF_ERROR(fill((*page)->mutable_data()));
    return page;
  }
  uint8_t* host = staging();
  SSA_RETURN_IF_ERROR(fill(host));
  SSA_CUDA_RETURN(cudaMemcpy((*page)->mutable_data(), host, bytes, cudaMemcpyHostToDevice), "page upload");
  return page;
}

absl::StatusOr<const uint8_t*> CudaBackend::page_to_host(const ssa_session& s, const Page& page, size_t bytes,
                                                         absl::FunctionRef<uint8_t*()> staging) const {
  if (page.bytes() < bytes) return make_error(SSA_ERR_INTERNAL, "device page is shorter than its layout");
  if (page.tier() != PageTier::kDevice) {
    // Host and file pages are read in place, once the device's writes to them are done.
    SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "page download");
    return page.data();
  }
  uint8_t* host = staging();
  // cudaMemcpyDefault: a sharded session's pages are on its shards' devices.
  SSA_CUDA_RETURN(cudaMemcpy(host, page.data(), bytes, cudaMemcpyDefault), "page download");
  return host;
}

}  // namespace ssa::cuda
