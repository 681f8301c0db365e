// The runtime: which backend serves sessions, the CPU worker threads, the default
// sampling seed, the device budget of its sessions' K/V. Shared by all threads of the embedding program.
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "cpu/thread_pool.h"
#include "ssa.h"
#include "store/budget_peers.h"
#include "store/device_budget.h"
#include "store/held_range.h"

namespace ssa {
class DecodeBufferPool;  // lib/decode/decode_buffers.h
class ProcessGroup;  // lib/shard/callback_collective.h
namespace cuda {
class PinnedChunkPool;  // lib/cuda/pinned_chunks.h
class SharedPagePools;  // lib/cuda/device_pages.h
}  // namespace cuda
}  // namespace ssa

struct ssa_runtime {
  ssa_backend backend = SSA_BACKEND_CPU;
  int32_t device = 0;
  // Sharding of every session of the runtime (lib/shard/shard_map.h): the
  // shards' devices in shard order (one entry, `device`, when unsharded) and
  // the tokens a shard takes before the next one starts.
  std::vector<int32_t> devices;
  uint64_t shard_tokens = 0;
  // A runtime that is one rank of a group of processes (ssa_runtime_options.collective):
  // the group's collectives; its sessions' shards are the group's ranks. Null otherwise.
  std::shared_ptr<ssa::ProcessGroup> group;
  // The tokens its sessions keep in this process: a group's rank, its shard's
  // (lib/shard/shard_map.h, held_tokens), on a CUDA rank also the first
  // kGroupMarginTokens of the next shard (lib/shard/group_margin.h); every
  // other runtime, all of them.
  ssa::HeldRange held;
  // The tokens whose pages it writes to a group's snapshot (its shard's: the
  // ranks' files hold disjoint pages); all of them when not a group's rank.
  ssa::HeldRange own;
  uint64_t seed = 0x5EED;
  std::unique_ptr<ssa::ThreadPool> pool;
  // Buffers its CPU decodes reuse from call to call (never null).
  std::shared_ptr<ssa::DecodeBufferPool> decode_buffers;
  // The device memory its CUDA sessions' K/V pages may use (never null; unlimited
  // unless ssa_runtime_options.device_kv_budget was set).
  std::shared_ptr<ssa::DeviceBudget> budget;
  // Its CUDA sessions that trade a limited budget between them (null when the
  // budget is unlimited).
  std::shared_ptr<ssa::BudgetPeers> budget_peers;
  // Pinned host memory page-locked at creation for its CUDA sessions' host tier
  // (ssa_runtime_options.host_pool_bytes); null without one, and on the CPU.
  std::shared_ptr<ssa::cuda::PinnedChunkPool> host_pool;
  // The device K/V page pools its CUDA sessions share under a limited budget, so
  // that the pages idle sessions give up are the blocks a reserving one brings
  // in; null otherwise, and on the CPU.
  std::shared_ptr<ssa::cuda::SharedPagePools> shared_pages;
};
