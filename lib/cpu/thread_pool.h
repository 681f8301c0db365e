// A fixed set of worker threads that runs parallel loops. Any number of caller
// threads may run loops at once (a runtime is shared by all threads); the caller
// works on its own loop too, so nested or concurrent loops never deadlock.
#pragma once

#include <stddef.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ssa {

class ThreadPool {
 public:
  // num_threads counts the caller. Throws (std::bad_alloc, std::system_error)
  // if the workers cannot all be started, after stopping those that were.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for i in [0, n), spread over the workers and the caller; returns
  // when all are done. If fn throws (std::bad_alloc when memory runs out), the
  // indices not yet started are skipped and the first exception is rethrown
  // here, in the caller, once no thread runs fn any more: an exception on a
  // worker thread would otherwise end the process.
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Loop;
  void worker_main();
  static void run_some(Loop& loop);
  void stop_workers();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Loop>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ssa
