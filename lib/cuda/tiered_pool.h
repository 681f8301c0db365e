// The KV pages of a CUDA session: device pages while the runtime's budget
// (lib/store/device_budget.h) has room, pinned host pages beyond it. Without a
// budget every page is a device page, exactly as a pool of device pages alone.
// Device pages of a budgeted runtime carry a charge that goes back to the budget
// when the last reference to their memory goes (after every queued decode that
// read them: the backend's tables hold the memory too).
#pragma once

#include <stddef.h>

#include <memory>

#include "absl/status/statusor.h"
#include "device_pages.h"
#include "pinned_pages.h"
#include "store/device_budget.h"
#include "store/page.h"

namespace ssa::cuda {

class TieredKvPool {
 public:
  // budget: the runtime's; host: null when the budget is unlimited.
  TieredKvPool(std::shared_ptr<DevicePagePool> device, std::shared_ptr<PinnedPagePool> host,
               std::shared_ptr<DeviceBudget> budget, size_t page_bytes)
      : device_(std::move(device)), host_(std::move(host)), budget_(std::move(budget)), page_bytes_(page_bytes) {}

  bool tiered() const { return host_ != nullptr; }
  size_t page_bytes() const { return page_bytes_; }
  DeviceBudget& budget() const { return *budget_; }
  // Pages the budget's resident account has room for now.
  uint64_t resident_room() const {
    const uint64_t limit = budget_->limit(DeviceBudget::kResident), used = budget_->used(DeviceBudget::kResident);
    return used < limit ? (limit - used) / page_bytes_ : 0;
  }
  const std::shared_ptr<PinnedPagePool>& host() const { return host_; }

  // A writable page where the placement puts a new one: the device when the
  // resident account has room, else the host tier.
  absl::StatusOr<PageRef> allocate();
  // A writable copy of `src`, placed as allocate() places.
  absl::StatusOr<PageRef> copy_of(const Page& src);
  // A device page charged to `account`, or null (no error) when the account has
  // no room; errors are allocation failures.
  absl::StatusOr<PageRef> device_page(DeviceBudget::Account account, bool zeroed = true);
  // A host-tier page (tiered pools only).
  absl::StatusOr<PageRef> host_page();

 private:
  const std::shared_ptr<DevicePagePool> device_;
  const std::shared_ptr<PinnedPagePool> host_;
  const std::shared_ptr<DeviceBudget> budget_;
  const size_t page_bytes_;
};

}  // namespace ssa::cuda
