#include "device_pages.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend.h"
#include "device_alloc.h"
#include "device_guard.h"
#include "runtime.h"
#include "status.h"

namespace ssa::cuda {

std::shared_ptr<DevicePagePool> DevicePagePool::create(size_t page_bytes, size_t max_free_pages, int device,
                                                       std::shared_ptr<DeviceBudget> bound) {
  return std::shared_ptr<DevicePagePool>(new DevicePagePool(page_bytes, max_free_pages, device, std::move(bound)));
}

DevicePagePool::~DevicePagePool() {
  const DeviceGuard on(device_);
  for (void* p : free_) cudaFreeAsync(p, nullptr);
}

absl::StatusOr<PageRef> DevicePagePool::allocate(bool zeroed) {
  void* block = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      block = free_.back();
      free_.pop_back();
    }
  }
  if (block == nullptr) {
    int caller = -1;
    if (cudaGetDevice(&caller) != cudaSuccess) cudaGetLastError();
    const DeviceGuard on(device_);
    if (on.error() != cudaSuccess) {
      cudaGetLastError();
      return make_error(SSA_ERR_DEVICE, absl::StrCat("cudaSetDevice(", device_, ") for a page"));
    }
    // Stream-ordered on the legacy default stream, where appends write pages;
    // complete for other streams once an append has synchronised it.
    const cudaError_t e = device_malloc_async(&block, page_bytes_, nullptr);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return make_error(e == cudaErrorMemoryAllocation ? SSA_ERR_OUT_OF_MEMORY : SSA_ERR_DEVICE,
                        absl::StrCat("device allocation of a ", page_bytes_, "-byte page: ", cudaGetErrorString(e)));
    }
    // Kernels read whole 4-token code words and page copies move whole pages,
    // past the rows written so far: zeroed once, those unused bytes are defined.
    if (zeroed && cudaMemsetAsync(block, 0, page_bytes_, nullptr) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeAsync(block, nullptr);
      return make_error(SSA_ERR_DEVICE, absl::StrCat("zeroing a new ", page_bytes_, "-byte page"));
    }
    // A page of another device than the caller's (a sharded session's shard) is
    // written next by work on the caller's device, which this device's legacy
    // stream does not order: the zeroing is waited for.
    if (device_ >= 0 && caller != device_ && cudaStreamSynchronize(nullptr) != cudaSuccess) {
      cudaGetLastError();
      return make_error(SSA_ERR_DEVICE, absl::StrCat("zeroing a new ", page_bytes_, "-byte page"));
    }
  }
  std::shared_ptr<DevicePagePool> self = shared_from_this();
  std::shared_ptr<void> keeper(block, [self](void* p) { self->release(p); });
  return std::make_shared<Page>(static_cast<uint8_t*>(block), page_bytes_, true, std::move(keeper),
                                PageTier::kDevice);
}

absl::StatusOr<PageRef> DevicePagePool::copy_of(const Page& src) {
  absl::StatusOr<PageRef> page = allocate();
  if (!page.ok()) return page.status();
  const DeviceGuard on(device_);
  const cudaError_t e = cudaMemcpy((*page)->mutable_data(), src.data(),
                                   src.bytes() < page_bytes_ ? src.bytes() : page_bytes_,
                                   cudaMemcpyDefault);
  if (e != cudaSuccess) return make_error(SSA_ERR_DEVICE, absl::StrCat("page copy: ", cudaGetErrorString(e)));
  return page;
}

void DevicePagePool::release(void* block) {
  absl::MutexLock lock(&mu_);
  bool fits = true;
  if (bound_ != nullptr) {  // the page's charge went back before its block (tiered_pool.cc)
    using A = DeviceBudget::Account;
    const uint64_t charged = bound_->used(A::kResident) + bound_->used(A::kCache);
    fits = charged + (free_.size() + 1) * page_bytes_ <= bound_->limit(A::kResident) + bound_->limit(A::kCache);
  }
  if (fits && free_.size() < max_free_) {
    free_.push_back(block);
    return;
  }
  const DeviceGuard on(device_);
  cudaFreeAsync(block, nullptr);  // cudaFree would wait for the whole device
}

absl::Status CudaBackend::init_budget(ssa_runtime& rt) const {
  rt.shared_pages = std::make_shared<SharedPagePools>(rt.budget);
  return absl::OkStatus();
}

std::shared_ptr<DevicePagePool> SharedPagePools::get(size_t page_bytes, int device) {
  absl::MutexLock lock(&mu_);
  for (auto it = pools_.begin(); it != pools_.end();) {
    if (std::get<2>(*it).expired()) {
      it = pools_.erase(it);
      continue;
    }
    if (std::get<0>(*it) == page_bytes && std::get<1>(*it) == device) {
      if (std::shared_ptr<DevicePagePool> p = std::get<2>(*it).lock()) return p;
    }
    ++it;
  }
  using A = DeviceBudget::Account;
  const uint64_t budget = budget_->limit(A::kResident) + budget_->limit(A::kCache);
  std::shared_ptr<DevicePagePool> p =
      DevicePagePool::create(page_bytes, std::max<size_t>(64, budget / page_bytes), device, budget_);
  pools_.emplace_back(page_bytes, device, p);
  return p;
}

}  // namespace ssa::cuda
