#include "nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "cuda/device_mem.h"
#include "status.h"

namespace ssa {
namespace {

absl::Status nccl_error(ncclResult_t r, const char* what) {
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", ncclGetErrorString(r)));
}
absl::Status cuda_error(cudaError_t e, const char* what) {
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
#define SSA_NCCL(expr, what)                          \
  do {                                                \
    const ncclResult_t r_ = (expr);                   \
    if (r_ != ncclSuccess) return nccl_error(r_, what); \
  } while (0)
#define SSA_CUDA(expr, what)                          \
  do {                                                \
    const cudaError_t e_ = (expr);                    \
    if (e_ != cudaSuccess) return cuda_error(e_, what); \
  } while (0)

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::create(void* comm, void* stream) {
  if (comm == nullptr) return invalid_argument("NCCL communicator is NULL");
  int rank = 0, count = 0, device = 0;
  SSA_NCCL(ncclCommUserRank(static_cast<ncclComm_t>(comm), &rank), "ncclCommUserRank");
  SSA_NCCL(ncclCommCount(static_cast<ncclComm_t>(comm), &count), "ncclCommCount");
  SSA_NCCL(ncclCommCuDevice(static_cast<ncclComm_t>(comm), &device), "ncclCommCuDevice");
  return std::unique_ptr<NcclCollective>(
      new NcclCollective(comm, stream, device, static_cast<uint32_t>(rank), static_cast<uint32_t>(count)));
}

NcclCollective::NcclCollective(void* comm, void* stream, int device, uint32_t rank, uint32_t size)
    : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size) {}

NcclCollective::~NcclCollective() {
  if (staging_ != nullptr) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    cudaFree(staging_);
    cudaSetDevice(prev);
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
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto c = static_cast<ncclComm_t>(comm_);
  SSA_CUDA(cudaSetDevice(device_), "cudaSetDevice");
  if (cuda::is_device_memory(data)) {
    SSA_NCCL(ncclAllReduce(data, data, n, static_cast<ncclDataType_t>(type), static_cast<ncclRedOp_t>(op), c, s),
             "ncclAllReduce");
  } else {
    const size_t bytes = n * elem_bytes;
    SSA_RETURN_IF_ERROR(scratch(bytes));
    SSA_CUDA(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    SSA_NCCL(ncclAllReduce(staging_, staging_, n, static_cast<ncclDataType_t>(type),
                           static_cast<ncclRedOp_t>(op), c, s),
             "ncclAllReduce");
    SSA_CUDA(cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  }
  SSA_CUDA(cudaStreamSynchronize(s), "cudaStreamSynchronize (collective)");
  return absl::OkStatus();
}

absl::Status NcclCollective::all_reduce_sum(uint64_t* data, size_t n) {
  return reduce(data, n, sizeof(uint64_t), ncclUint64, ncclSum);
}

absl::Status NcclCollective::all_reduce_max(float* data, size_t n) {
  return reduce(data, n, sizeof(float), ncclFloat32, ncclMax);
}

absl::Status NcclCollective::all_gather(const void* send, size_t bytes, void* recv) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto c = static_cast<ncclComm_t>(comm_);
  SSA_CUDA(cudaSetDevice(device_), "cudaSetDevice");
  if (cuda::is_device_memory(send) && cuda::is_device_memory(recv)) {
    SSA_NCCL(ncclAllGather(send, recv, bytes, ncclUint8, c, s), "ncclAllGather");
  } else {
    SSA_RETURN_IF_ERROR(scratch(bytes * (size_t{size_} + 1)));
    uint8_t* in = static_cast<uint8_t*>(staging_);
    uint8_t* out = in + bytes;
    SSA_CUDA(cudaMemcpyAsync(in, send, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    SSA_NCCL(ncclAllGather(in, out, bytes, ncclUint8, c, s), "ncclAllGather");
    SSA_CUDA(cudaMemcpyAsync(recv, out, bytes * size_, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  }
  SSA_CUDA(cudaStreamSynchronize(s), "cudaStreamSynchronize (collective)");
  return absl::OkStatus();
}

}  // namespace ssa
