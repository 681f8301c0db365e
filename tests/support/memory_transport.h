// An in-memory transport for the ranks of a group run as threads of one
// process (ssa_runtime_options.collective, docs/DISTRIBUTED.md): each rank's
// table of callbacks goes through shared memory with a real timeout, as a
// process's would go through MPI or gloo. Host buffers only, as the C API's
// callbacks take them.
#pragma once

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ssa.h"

namespace ssa_test::transport {

// The ranks' shared memory: each collective publishes every rank's buffer, then
// (after a barrier) every rank computes its result from all of them, then (after
// a second barrier, nobody reading any more) writes it back.
struct Transport {
  explicit Transport(uint32_t n) : n(n), pub(n, nullptr) {}
  const uint32_t n;
  std::mutex mu;
  std::condition_variable cv;
  uint32_t arrived = 0;
  uint64_t generation = 0;
  std::vector<const void*> pub;

  bool barrier(uint32_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    return cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return generation != gen; });
  }
};

struct RankLink {
  Transport* t;
  uint32_t rank;
  int calls = 0;
};

template <typename T, typename Op>
inline int reduce(void* user, T* data, size_t n, uint32_t timeout_ms, Op op) {
  RankLink& l = *static_cast<RankLink*>(user);
  ++l.calls;
  std::vector<T> acc(data, data + n);
  l.t->pub[l.rank] = data;
  if (!l.t->barrier(timeout_ms)) return 7;
  for (uint32_t r = 0; r < l.t->n; ++r) {
    if (r == l.rank) continue;
    const T* theirs = static_cast<const T*>(l.t->pub[r]);
    for (size_t i = 0; i < n; ++i) acc[i] = op(acc[i], theirs[i]);
  }
  if (!l.t->barrier(timeout_ms)) return 7;
  std::copy(acc.begin(), acc.end(), data);
  return 0;
}

inline int sum_u64(void* user, uint64_t* data, size_t n, uint32_t timeout_ms) {
  return reduce<uint64_t>(user, data, n, timeout_ms, [](uint64_t a, uint64_t b) { return a + b; });
}
inline int max_f32(void* user, float* data, size_t n, uint32_t timeout_ms) {
  return reduce<float>(user, data, n, timeout_ms, [](float a, float b) { return a > b ? a : b; });
}
inline int gather(void* user, const void* send, size_t bytes, void* recv, uint32_t timeout_ms) {
  RankLink& l = *static_cast<RankLink*>(user);
  ++l.calls;
  l.t->pub[l.rank] = send;
  if (!l.t->barrier(timeout_ms)) return 7;
  for (uint32_t r = 0; r < l.t->n; ++r) {
    if (bytes != 0) memcpy(static_cast<uint8_t*>(recv) + r * bytes, l.t->pub[r], bytes);
  }
  if (!l.t->barrier(timeout_ms)) return 7;
  return 0;
}

inline ssa_collective table_of(RankLink* link, uint32_t timeout_ms = 20000) {
  ssa_collective c;
  ssa_collective_init(&c);
  c.rank = link->rank;
  c.size = link->t->n;
  c.timeout_ms = timeout_ms;
  c.user = link;
  c.all_reduce_sum_u64 = sum_u64;
  c.all_reduce_max_f32 = max_f32;
  c.all_gather = gather;
  return c;
}

// Runs body(rank, link) on one thread per rank of a fresh transport.
inline void run_ranks(uint32_t n, const std::function<void(uint32_t, RankLink&)>& body) {
  Transport t(n);
  std::vector<RankLink> links;
  for (uint32_t r = 0; r < n; ++r) links.push_back(RankLink{&t, r});
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, links[r]); });
  for (std::thread& th : threads) th.join();
}

}  // namespace ssa_test::transport
