#include "decode_buffers.h"

namespace ssa {

DecodeBufferPool::Lease DecodeBufferPool::acquire() {
  std::unique_ptr<DecodeBuffers> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (b == nullptr) b = std::make_unique<DecodeBuffers>();
  return Lease(b.release(), Return{this});
}

void DecodeBufferPool::give_back(DecodeBuffers* b) {
  std::unique_ptr<DecodeBuffers> owned(b);
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < kKeep) free_.push_back(std::move(owned));
}

}  // namespace ssa
