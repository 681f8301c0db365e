// Where the decodes that read a layer's device tables stand: one event per
// stream they were queued on, recorded after the latest of them. What must have
// run before those tables, their pages or their codebooks may be freed or
// rewritten. Callers serialise access (SessionState::mu, lib/cuda/device_state.h).
#pragma once

#include <cuda_runtime.h>

#include <vector>

namespace ssa::cuda {

class LastUse {
 public:
  LastUse() = default;
  LastUse(const LastUse&) = delete;
  LastUse& operator=(const LastUse&) = delete;
  ~LastUse() {
    for (const Mark& m : marks_) cudaEventDestroy(m.event);
  }
  // After the work queued on st so far. Not while st is being captured into a
  // graph: replays are the caller's to order (ssa.h).
  cudaError_t record(cudaStream_t st) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(st, &cap);
    if (e != cudaSuccess || cap != cudaStreamCaptureStatusNone) return e;
    // Marks of other streams that have passed are dropped (streams come and go).
    for (size_t i = 0; i < marks_.size();) {
      if (marks_[i].stream != st && !running(marks_[i].event)) {
        cudaEventDestroy(marks_[i].event);
        marks_[i] = marks_.back();
        marks_.pop_back();
      } else {
        ++i;
      }
    }
    for (const Mark& m : marks_)
      if (m.stream == st) return cudaEventRecord(m.event, st);
    Mark m{st, nullptr};
    if ((e = cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming)) != cudaSuccess) return e;
    marks_.push_back(m);
    return cudaEventRecord(m.event, st);
  }
  // True while a recorded decode may still run.
  bool pending() const {
    for (const Mark& m : marks_)
      if (running(m.event)) return true;
    return false;
  }
  void wait() const {
    for (const Mark& m : marks_) cudaEventSynchronize(m.event);
  }

 private:
  struct Mark {
    cudaStream_t stream;
    cudaEvent_t event;
  };
  // A failed query counts as done: the device is then unusable anyway.
  static bool running(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r != cudaSuccess && r != cudaErrorNotReady) cudaGetLastError();
    return r == cudaErrorNotReady;
  }
  std::vector<Mark> marks_;
};

}  // namespace ssa::cuda
