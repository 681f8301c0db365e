// What a CPU decode of one layer fills and drops at every call: each query
// head's selection, the group entries the split attention sorts, the partials.
// At a million tokens these are megabytes; allocated fresh per call, the kernel
// maps, zero-fills and unmaps them every time (keeping them took a 1M-token
// decode from 136-170 to 120-123 ms in the Llama shape; bench/NOTEBOOK.md). A runtime keeps a few sets between decodes (DecodeBufferPool), one per
// decode running at once, so their capacity is reused. The contents carry no
// meaning between decodes: every user clears or overwrites what it reads.
#pragma once

#include <stddef.h>

#include <memory>
#include <mutex>
#include <vector>

#include "cpu/attention.h"
#include "select/selection.h"

namespace ssa {

// The union of a KV group's selections in token order and where each split's
// entries begin (lib/decode/split_attention.cc), one vector per KV head.
struct SplitEntries {
  std::vector<std::vector<GroupEntry>> entries;
  std::vector<std::vector<size_t>> split_begin;
};

struct DecodeBuffers {
  std::vector<Selection> sels;
  SplitEntries split;
  std::vector<AttnPartial> parts;
};

class DecodeBufferPool {
 public:
  struct Return {
    DecodeBufferPool* pool;
    void operator()(DecodeBuffers* b) const { pool->give_back(b); }
  };
  using Lease = std::unique_ptr<DecodeBuffers, Return>;

  // A set of buffers for one decode (a kept one, or new); it goes back to the
  // pool when the lease ends. Thread-safe. The pool must outlive its leases.
  Lease acquire();

 private:
  void give_back(DecodeBuffers* b);

  // Sets kept beyond this many are freed: they were made by a burst of
  // concurrent decodes, and each may hold megabytes.
  static constexpr size_t kKeep = 4;
  // A std::mutex, as the rest of the CPU decode path: the thread sanitizer sees it.
  std::mutex mu_;
  std::vector<std::unique_ptr<DecodeBuffers>> free_;  // guarded by mu_
};

}  // namespace ssa
