#include "callback_collective.h"

#include <string.h>

#include <new>
#include <vector>

#include "shard_options.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::create(const ssa_collective* table) {
  ssa_collective t;
  ssa_collective_init(&t);
  SSA_RETURN_IF_ERROR(read_struct(table, &t));
  if (t.size == 0 || t.size > kMaxShards) {
    return invalid_argument("ssa_collective.size ", t.size, " must be in 1..", kMaxShards);
  }
  if (t.rank >= t.size) return invalid_argument("ssa_collective.rank ", t.rank, " must be < size ", t.size);
  if (t.timeout_ms == 0) return invalid_argument("ssa_collective.timeout_ms must be > 0");
  if (t.all_reduce_sum_u64 == nullptr || t.all_reduce_max_f32 == nullptr || t.all_gather == nullptr) {
    return invalid_argument("ssa_collective: all_reduce_sum_u64, all_reduce_max_f32 and all_gather must be set");
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(t));
}

absl::Status ProcessGroup::check(const char* op, int rc) {
  if (rc == 0) return absl::OkStatus();
  broken_.store(true);
  return make_error(SSA_ERR_IO, absl::StrCat("collective ", op, " failed on rank ", t_.rank, " of ", t_.size,
                                             " (callback returned ", rc, "): a peer rank failed, left, or did "
                                             "not arrive within timeout_ms ", t_.timeout_ms,
                                             "; the group is now out of step: destroy the runtime"));
}

namespace {
absl::Status broken_error(const ssa_collective& t) {
  return make_error(SSA_ERR_IO, absl::StrCat("rank ", t.rank, " of ", t.size,
                                             ": an earlier collective of this runtime's group failed, so the "
                                             "ranks are out of step; destroy the runtime and build a new group"));
}
}  // namespace

absl::Status ProcessGroup::all_reduce_sum(uint64_t* data, size_t n) {
  if (broken_.load()) return broken_error(t_);
  return check("all_reduce_sum_u64", t_.all_reduce_sum_u64(t_.user, data, n, t_.timeout_ms));
}

absl::Status ProcessGroup::all_reduce_max(float* data, size_t n) {
  if (broken_.load()) return broken_error(t_);
  return check("all_reduce_max_f32", t_.all_reduce_max_f32(t_.user, data, n, t_.timeout_ms));
}

absl::Status ProcessGroup::all_gather(const void* send, size_t bytes, void* recv) {
  if (broken_.load()) return broken_error(t_);
  return check("all_gather", t_.all_gather(t_.user, send, bytes, recv, t_.timeout_ms));
}

absl::Status check_group_backend(const ssa_runtime_options& o, const std::vector<int32_t>& devices) {
  if (o.backend == SSA_BACKEND_CUDA) {
    return unsupported("ssa_runtime_options.collective with the CUDA backend: GPU groups (one process per GPU "
                       "over NCCL) are not implemented in this version; use SSA_BACKEND_CPU (or AUTO, which a "
                       "collective makes CPU)");
  }
  if (devices.size() > 1) {
    return unsupported("ssa_runtime_options.collective with a devices list of ", devices.size(),
                       " entries: a rank of a group holds one shard; pass no list");
  }
  return absl::OkStatus();
}

absl::Status check_group_agreement(ProcessGroup& g, uint64_t shard_tokens) {
  struct Claim {
    uint64_t rank, size, shard_tokens, version;
  };
  constexpr uint64_t kVersion = (uint64_t{SSA_VERSION_MAJOR} << 32) | (uint64_t{SSA_VERSION_MINOR} << 16) |
                                uint64_t{SSA_VERSION_PATCH};
  const Claim mine{g.rank(), g.size(), shard_tokens, kVersion};
  std::vector<Claim> all(g.size());
  SSA_RETURN_IF_ERROR(g.all_gather(&mine, sizeof mine, all.data()));
  for (uint32_t r = 0; r < g.size(); ++r) {
    const Claim& c = all[r];
    if (c.rank != r || c.size != g.size()) {
      return invalid_argument("ssa_collective: the process at position ", r, " of the group's all_gather says it is rank ",
                              c.rank, " of ", c.size, " (this one: rank ", g.rank(), " of ", g.size(),
                              "); every rank must pass its own rank and the same size");
    }
    if (c.shard_tokens != shard_tokens) {
      return invalid_argument("ssa_runtime_options.shard_tokens differs between ranks (rank ", r, ": ",
                              c.shard_tokens, ", rank ", g.rank(), ": ", shard_tokens, ")");
    }
    if (c.version != mine.version) {
      return unsupported("rank ", r, " runs libssa version code ", c.version, ", this rank ", mine.version,
                         ": every rank of a group must run the same version");
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa
