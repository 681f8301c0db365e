// Makes one device current for a scope and gives the caller's back after it. The
// current device is per host thread, and a sharded session works on several:
// every page allocation, table upload and launch of a shard happens on the
// shard's device, wherever the caller's thread stood.
#pragma once

#include <cuda_runtime.h>

namespace ssa::cuda {

class DeviceGuard {
 public:
  // device < 0: the current device stays.
  explicit DeviceGuard(int device) {
    if (device < 0 || cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (previous_ == device) return;
    error_ = cudaSetDevice(device);
    switched_ = error_ == cudaSuccess;
  }
  ~DeviceGuard() {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // cudaSuccess unless the switch failed.
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace ssa::cuda
