// The runtime: which backend serves sessions, the CPU worker threads, the default
// sampling seed. Shared by all threads of the embedding program.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "cpu/thread_pool.h"
#include "ssa.h"

struct ssa_runtime {
  ssa_backend backend = SSA_BACKEND_CPU;
  int32_t device = 0;
  // Sharding of every session of the runtime (lib/shard/shard_map.h): the
  // shards' devices in shard order (one entry, `device`, when unsharded) and
  // the tokens a shard takes before the next one starts.
  std::vector<int32_t> devices;
  uint64_t shard_tokens = 0;
  uint64_t seed = 0x5EED;
  std::unique_ptr<ssa::ThreadPool> pool;
};
