#include "thread_pool.h"

#include <atomic>
#include <exception>

namespace ssa {

struct ThreadPool::Loop {
  const std::function<void(size_t)>* fn;
  size_t n;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::atomic<bool> failed{false};  // set once fn threw: skip what is left
  std::exception_ptr error;         // the first exception; guarded by mu
  std::mutex mu;
  std::condition_variable finished;
};

ThreadPool::ThreadPool(int num_threads) {
  try {
    workers_.reserve(num_threads > 1 ? num_threads - 1 : 0);
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_main(); });
  } catch (...) {
    // The destructor does not run for a constructor that throws, and a joinable
    // std::thread destroyed unjoined ends the process.
    stop_workers();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_some(Loop& loop) {
  size_t finished_here = 0;
  for (;;) {
    const size_t i = loop.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= loop.n) break;
    ++finished_here;  // counted as done whether it runs, throws or is skipped
    if (loop.failed.load(std::memory_order_relaxed)) continue;
    try {
      (*loop.fn)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(loop.mu);
      if (!loop.error) loop.error = std::current_exception();
      loop.failed.store(true, std::memory_order_relaxed);
    }
  }
  if (finished_here != 0 &&
      loop.done.fetch_add(finished_here, std::memory_order_acq_rel) + finished_here == loop.n) {
    std::lock_guard<std::mutex> lock(loop.mu);
    loop.finished.notify_all();
  }
}

void ThreadPool::worker_main() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      loop = queue_.front();
      // Leave the loop queued while indices remain so other workers join it.
      if (loop->next.load(std::memory_order_relaxed) >= loop->n) {
        queue_.pop_front();
        continue;
      }
    }
    run_some(*loop);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty() && queue_.front() == loop) queue_.pop_front();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);  // exceptions reach the caller directly
    return;
  }
  auto loop = std::make_shared<Loop>();
  loop->fn = &fn;
  loop->n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(loop);
  }
  cv_.notify_all();
  run_some(*loop);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(loop->mu);
    loop->finished.wait(lock, [&] { return loop->done.load(std::memory_order_acquire) == n; });
    error = loop->error;
  }
  {
    // Remove it from the queue if no worker did (all indices were taken here).
    std::lock_guard<std::mutex> qlock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == loop) {
        queue_.erase(it);
        break;
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ssa
