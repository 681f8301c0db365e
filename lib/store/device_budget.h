// The device memory a runtime's CUDA sessions may use for K/V pages
// (ssa_runtime_options.device_kv_budget), in two accounts: resident pages (the
// pages a session's layers hold on the device) and cached copies of host pages
// (host_cache_bytes of it). Charges are taken before an allocation and given
// back when the memory is freed, so the device never holds more K/V than the
// budget, whatever the order of allocations across sessions and threads.
#pragma once

#include <stdint.h>

#include <atomic>

namespace ssa {

class DeviceBudget {
 public:
  enum Account { kResident = 0, kCache = 1 };

  // total: bytes in all (0 = no limit); cache: the share kept for cached copies
  // (at most total).
  DeviceBudget(uint64_t total, uint64_t cache)
      : limited_(total != 0), limit_{total - cache, cache} {}

  bool limited() const { return limited_; }
  uint64_t limit(Account a) const { return limited_ ? limit_[a] : UINT64_MAX; }
  uint64_t used(Account a) const { return used_[a].load(std::memory_order_relaxed); }

  // Takes `bytes` from the account when they fit; false (nothing taken) when not.
  bool try_charge(Account a, uint64_t bytes) {
    if (!limited_) {
      used_[a].fetch_add(bytes, std::memory_order_relaxed);
      return true;
    }
    uint64_t cur = used_[a].load(std::memory_order_relaxed);
    do {
      if (bytes > limit_[a] || cur > limit_[a] - bytes) return false;
    } while (!used_[a].compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return true;
  }
  void release(Account a, uint64_t bytes) { used_[a].fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  const bool limited_;
  const uint64_t limit_[2];
  std::atomic<uint64_t> used_[2] = {0, 0};
};

}  // namespace ssa
