#include "in_process_collective.h"

#include <string.h>

#include <algorithm>
#include <exception>
#include <new>
#include <thread>

#include "status.h"

namespace ssa {

namespace {
constexpr const char* kAborted = "a peer shard of this decode failed";
}  // namespace

class InProcessCollective final : public Collective {
 public:
  InProcessCollective(InProcessGroup& g, uint32_t rank) : g_(g), rank_(rank) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return g_.n_; }

  absl::Status all_reduce_sum(uint64_t* data, size_t n) override {
    return reduce<uint64_t>(data, n, [](uint64_t a, uint64_t b) { return a + b; });
  }
  absl::Status all_reduce_max(float* data, size_t n) override {
    return reduce<float>(data, n, [](float a, float b) { return std::max(a, b); });
  }
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override {
    g_.published_[rank_] = send;
    if (!g_.barrier()) return g_.aborted_status_;
    for (uint32_t r = 0; r < g_.n_; ++r) {
      if (bytes != 0) memcpy(static_cast<uint8_t*>(recv) + r * bytes, g_.published_[r], bytes);
    }
    if (!g_.barrier()) return g_.aborted_status_;
    return absl::OkStatus();
  }

 private:
  template <typename T, typename Op>
  absl::Status reduce(T* data, size_t n, Op op) {
    std::vector<T> result(data, data + n);  // before publishing: a failed allocation aborts nobody
    g_.published_[rank_] = data;
    if (!g_.barrier()) return g_.aborted_status_;
    for (uint32_t r = 0; r < g_.n_; ++r) {
      if (r == rank_) continue;
      const T* theirs = static_cast<const T*>(g_.published_[r]);
      for (size_t i = 0; i < n; ++i) result[i] = op(result[i], theirs[i]);
    }
    if (!g_.barrier()) return g_.aborted_status_;
    std::copy(result.begin(), result.end(), data);
    return absl::OkStatus();
  }

  InProcessGroup& g_;
  const uint32_t rank_;
};

bool InProcessGroup::barrier() {
  std::unique_lock lock(mu_);
  if (aborted_) return false;
  const uint64_t gen = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  return generation_ != gen;
}

void InProcessGroup::abort() {
  std::lock_guard lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

InProcessGroup::InProcessGroup(uint32_t n_ranks)
    : n_(n_ranks),
      published_(n_ranks, nullptr),
      aborted_status_(internal_error(kAborted)),
      out_of_memory_(make_error(SSA_ERR_OUT_OF_MEMORY, "out of host memory")) {}

absl::Status InProcessGroup::run(const std::function<absl::Status(Collective&)>& body) {
  std::vector<absl::Status> results(n_);
  std::vector<uint8_t> own_failure(n_, 0);  // bytes: ranks write their own at once
  // Nothing may leave a rank's thread: every failure becomes its status (the
  // prepared ones, where making a message could itself fail).
  auto rank_main = [&](uint32_t r) noexcept {
    absl::Status st;
    try {
      InProcessCollective comm(*this, r);
      st = body(comm);
    } catch (const std::bad_alloc&) {
      st = out_of_memory_;
    } catch (const std::exception& e) {
      st = out_of_memory_;  // if even the message cannot be made
      try {
        st = internal_error(e.what());
      } catch (...) {
      }
    } catch (...) {
      st = out_of_memory_;
      try {
        st = internal_error("unknown exception in a shard of the decode");
      } catch (...) {
      }
    }
    if (!st.ok()) {
      bool aborted;
      {
        std::lock_guard lock(mu_);
        aborted = aborted_;
      }
      own_failure[r] = !aborted || st.message() != kAborted;
      abort();
    }
    results[r] = std::move(st);
  };
  std::vector<std::thread> threads;
  bool spawned = true;
  try {
    threads.reserve(n_ - 1);
    for (uint32_t r = 1; r < n_; ++r) threads.emplace_back(rank_main, r);
  } catch (...) {
    spawned = false;
    abort();  // the ranks already started return from their first collective
  }
  if (spawned) rank_main(0);
  for (std::thread& t : threads) t.join();
  if (!spawned) return make_error(SSA_ERR_OUT_OF_MEMORY, "cannot start the threads of the decode's shards");
  for (uint32_t r = 0; r < n_; ++r) {
    if (!results[r].ok() && own_failure[r]) return results[r];
  }
  for (uint32_t r = 0; r < n_; ++r) {
    if (!results[r].ok()) return results[r];
  }
  return absl::OkStatus();
}

}  // namespace ssa
