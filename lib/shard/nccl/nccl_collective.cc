#include "nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "cuda/device_mem.h"
#include "nccl_api.h"
#include "status.h"

namespace ssa {
namespace {

// The process's NCCL: NcclCollective::create checks that it loads before any
// other call can be made.
const NcclApi* nccl() { return *nccl_api(); }

absl::Status nccl_error(ncclResult_t r, const char* what) {
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", nccl()->GetErrorString(r)));
}
absl::Status cuda_error(cudaError_t e, const char* what) {
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
// ncclInProgress: a non-blocking communicator queued the call (finish waits).
#define SSA_NCCL(expr, what)                                                  \
  do {                                                                        \
    const ncclResult_t r_ = (expr);                                           \
    if (r_ != ncclSuccess && r_ != ncclInProgress) return nccl_error(r_, what); \
  } while (0)
#define SSA_CUDA(expr, what)                          \
  do {                                                \
    const cudaError_t e_ = (expr);                    \
    if (e_ != cudaSuccess) return cuda_error(e_, what); \
  } while (0)

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::create(void* comm, void* stream,
                                                                        uint32_t timeout_ms) {
  if (comm == nullptr) return invalid_argument("NCCL communicator is NULL");
  if (timeout_ms == 0) return invalid_argument("NCCL collectives need a timeout > 0");
  absl::StatusOr<const NcclApi*> api = nccl_api();
  if (!api.ok()) return api.status();
  int rank = 0, count = 0, device = 0;
  SSA_NCCL(nccl()->CommUserRank(static_cast<ncclComm_t>(comm), &rank), "ncclCommUserRank");
  SSA_NCCL(nccl()->CommCount(static_cast<ncclComm_t>(comm), &count), "ncclCommCount");
  SSA_NCCL(nccl()->CommCuDevice(static_cast<ncclComm_t>(comm), &device), "ncclCommCuDevice");
  if (rank < 0 || count <= 0 || rank >= count) {
    return invalid_argument("NCCL communicator reports rank ", rank, " of ", count);
  }
  return std::unique_ptr<NcclCollective>(new NcclCollective(comm, stream, device, static_cast<uint32_t>(rank),
                                                            static_cast<uint32_t>(count), timeout_ms));
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::create_with_stream(void* comm,
                                                                                   uint32_t timeout_ms) {
  absl::StatusOr<std::unique_ptr<NcclCollective>> c = create(comm, nullptr, timeout_ms);
  if (!c.ok()) return c.status();
  int prev = 0;
  SSA_CUDA(cudaGetDevice(&prev), "cudaGetDevice");
  SSA_CUDA(cudaSetDevice((*c)->device_), "cudaSetDevice");
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaSetDevice(prev);
  SSA_CUDA(e, "cudaStreamCreate (collective stream)");
  (*c)->stream_ = s;
  (*c)->owns_stream_ = true;
  return c;
}

NcclCollective::NcclCollective(void* comm, void* stream, int device, uint32_t rank, uint32_t size,
                               uint32_t timeout_ms)
    : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size), timeout_ms_(timeout_ms) {}

NcclCollective::~NcclCollective() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  if (staging_ != nullptr) cudaFree(staging_);
  if (owns_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaSetDevice(prev);
}

absl::Status NcclCollective::aborted_error() const {
  return make_error(SSA_ERR_IO, absl::StrCat("NCCL rank ", rank_, " of ", size_,
                                             ": the communicator was aborted after a failed collective"));
}

absl::Status NcclCollective::finish(const char* what) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto c = static_cast<ncclComm_t>(comm_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (uint32_t spins = 0;; ++spins) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return cuda_error(q, what);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = nccl()->CommGetAsyncError(c, &async);
    const bool failed = r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress);
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (failed || late) {
      // The collective cannot complete (a peer failed, left or never came): the
      // communicator is aborted, which also ends the kernels waiting on it.
      nccl()->CommAbort(c);
      aborted_ = true;
      if (cudaStreamSynchronize(s) != cudaSuccess) cudaGetLastError();
      return make_error(SSA_ERR_IO,
                        absl::StrCat(what, " on NCCL rank ", rank_, " of ", size_, ": ",
                                     failed ? absl::StrCat("the communicator reported ",
                                                           nccl()->GetErrorString(r != ncclSuccess ? r : async))
                                            : absl::StrCat("not complete within ", timeout_ms_, " ms"),
                                     "; the communicator was aborted (ncclCommAbort)"));
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

absl::Status NcclCollective::scratch(size_t bytes) {
  if (bytes <= staging_bytes_) return absl::OkStatus();
  if (staging_ != nullptr) SSA_CUDA(cudaFree(staging_), "cudaFree");
  staging_ = nullptr;
  staging_bytes_ = 0;
  SSA_CUDA(cudaMalloc(&staging_, bytes), "cudaMalloc (collective staging)");
  staging_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status NcclCollective::reduce(void* data, size_t n, size_t elem_bytes, int type, int op) {
  if (aborted_) return aborted_error();
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto c = static_cast<ncclComm_t>(comm_);
  SSA_CUDA(cudaSetDevice(device_), "cudaSetDevice");
  if (cuda::is_device_memory(data)) {
    SSA_NCCL(nccl()->AllReduce(data, data, n, static_cast<ncclDataType_t>(type), static_cast<ncclRedOp_t>(op), c, s),
             "ncclAllReduce");
  } else {
    const size_t bytes = n * elem_bytes;
    SSA_RETURN_IF_ERROR(scratch(bytes));
    SSA_CUDA(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    SSA_NCCL(nccl()->AllReduce(staging_, staging_, n, static_cast<ncclDataType_t>(type),
                           static_cast<ncclRedOp_t>(op), c, s),
             "ncclAllReduce");
    SSA_CUDA(cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  }
  return finish("ncclAllReduce");
}

absl::Status NcclCollective::all_reduce_sum(uint64_t* data, size_t n) {
  return reduce(data, n, sizeof(uint64_t), ncclUint64, ncclSum);
}

absl::Status NcclCollective::all_reduce_max(float* data, size_t n) {
  return reduce(data, n, sizeof(float), ncclFloat32, ncclMax);
}

absl::Status NcclCollective::all_gather(const void* send, size_t bytes, void* recv) {
  if (aborted_) return aborted_error();
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto c = static_cast<ncclComm_t>(comm_);
  SSA_CUDA(cudaSetDevice(device_), "cudaSetDevice");
  if (cuda::is_device_memory(send) && cuda::is_device_memory(recv)) {
    SSA_NCCL(nccl()->AllGather(send, recv, bytes, ncclUint8, c, s), "ncclAllGather");
  } else {
    SSA_RETURN_IF_ERROR(scratch(bytes * (size_t{size_} + 1)));
    uint8_t* in = static_cast<uint8_t*>(staging_);
    uint8_t* out = in + bytes;
    SSA_CUDA(cudaMemcpyAsync(in, send, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    SSA_NCCL(nccl()->AllGather(in, out, bytes, ncclUint8, c, s), "ncclAllGather");
    SSA_CUDA(cudaMemcpyAsync(recv, out, bytes * size_, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  }
  return finish("ncclAllGather");
}

}  // namespace ssa
