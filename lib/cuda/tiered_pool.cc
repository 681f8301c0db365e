#include "tiered_pool.h"

#include <cuda_runtime.h>

#include "status.h"

namespace ssa::cuda {
namespace {

// Keeps a device block and its budget charge; the charge goes back first.
// Not copyable: each object gives its charge back exactly once.
struct Charge {
  Charge(std::shared_ptr<void> b, std::shared_ptr<DeviceBudget> d, DeviceBudget::Account a, uint64_t n)
      : block(std::move(b)), budget(std::move(d)), account(a), bytes(n) {}
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() { budget->release(account, bytes); }
  std::shared_ptr<void> block;
  std::shared_ptr<DeviceBudget> budget;
  DeviceBudget::Account account;
  uint64_t bytes;
};

}  // namespace

absl::StatusOr<PageRef> TieredKvPool::device_page(DeviceBudget::Account account, bool zeroed) {
  if (!tiered()) return device_->allocate(zeroed);
  if (!budget_->try_charge(account, page_bytes_)) return PageRef{};
  absl::StatusOr<PageRef> inner = device_->allocate(zeroed);
  if (!inner.ok()) {
    budget_->release(account, page_bytes_);
    return inner.status();
  }
  auto charge = std::make_shared<Charge>((*inner)->keeper(), budget_, account, page_bytes_);
  uint8_t* data = (*inner)->mutable_data();
  inner->reset();  // the Charge holds the block now
  return std::make_shared<Page>(data, page_bytes_, true, std::move(charge), PageTier::kDevice);
}

absl::StatusOr<PageRef> TieredKvPool::host_page() {
  if (!tiered()) return internal_error("host-tier page of a session without a device budget");
  return host_->allocate();
}

absl::StatusOr<PageRef> TieredKvPool::allocate() {
  absl::StatusOr<PageRef> page = device_page(DeviceBudget::kResident);
  if (!page.ok() || *page != nullptr) return page;
  return host_->allocate();
}

absl::StatusOr<PageRef> TieredKvPool::copy_of(const Page& src) {
  absl::StatusOr<PageRef> page = allocate();
  if (!page.ok()) return page.status();
  const cudaError_t e = cudaMemcpy((*page)->mutable_data(), src.data(),
                                   src.bytes() < page_bytes_ ? src.bytes() : page_bytes_, cudaMemcpyDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(SSA_ERR_DEVICE, absl::StrCat("page copy: ", cudaGetErrorString(e)));
  }
  return page;
}

}  // namespace ssa::cuda
