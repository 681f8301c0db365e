#include "callback_collective.h"

#include <string.h>

#include <new>
#include <vector>

#include "shard_options.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {

namespace {

// The caller's table of callbacks (host buffers), each call with its timeout.
class CallbackTransport final : public Collective {
 public:
  explicit CallbackTransport(const ssa_collective& t) : t_(t) {}
  uint32_t rank() const override { return t_.rank; }
  uint32_t size() const override { return t_.size; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override {
    return result(t_.all_reduce_sum_u64(t_.user, data, n, t_.timeout_ms));
  }
  absl::Status all_reduce_max(float* data, size_t n) override {
    return result(t_.all_reduce_max_f32(t_.user, data, n, t_.timeout_ms));
  }
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override {
    return result(t_.all_gather(t_.user, send, bytes, recv, t_.timeout_ms));
  }

 private:
  static absl::Status result(int rc) {
    if (rc == 0) return absl::OkStatus();
    return make_error(SSA_ERR_IO, absl::StrCat("callback returned ", rc));
  }
  const ssa_collective t_;
};

}  // namespace

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
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(std::make_unique<CallbackTransport>(t), t.timeout_ms, "callback"));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::over(std::unique_ptr<Collective> transport,
                                                                 uint32_t timeout_ms, const char* what) {
  if (transport == nullptr) return internal_error("a group without a transport");
  if (transport->size() == 0 || transport->size() > kMaxShards) {
    return unsupported(what, " groups of ", transport->size(), " ranks: 1..", kMaxShards, " are supported");
  }
  if (transport->rank() >= transport->size()) {
    return invalid_argument(what, ": rank ", transport->rank(), " is not below the group's size ",
                            transport->size());
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(transport), timeout_ms, what));
}

ProcessGroup::ProcessGroup(std::unique_ptr<Collective> transport, uint32_t timeout_ms, const char* what)
    : transport_(std::move(transport)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      timeout_ms_(timeout_ms),
      what_(what) {}

absl::Status ProcessGroup::check(const char* op, absl::Status st) {
  if (st.ok()) return st;
  broken_.store(true);
  return make_error(SSA_ERR_IO, absl::StrCat("collective ", op, " failed on rank ", rank_, " of ", size_, " (",
                                             what_, ": ", st.message(), "): a peer rank failed, left, or did "
                                             "not arrive within timeout_ms ", timeout_ms_,
                                             "; the group is now out of step: destroy the runtime"));
}

absl::Status ProcessGroup::broken_error() const {
  return make_error(SSA_ERR_IO, absl::StrCat("rank ", rank_, " of ", size_,
                                             ": an earlier collective of this runtime's group failed, so the "
                                             "ranks are out of step; destroy the runtime and build a new group"));
}

absl::Status ProcessGroup::all_reduce_sum(uint64_t* data, size_t n) {
  if (broken_.load()) return broken_error();
  return check("all_reduce_sum_u64", transport_->all_reduce_sum(data, n));
}

absl::Status ProcessGroup::all_reduce_max(float* data, size_t n) {
  if (broken_.load()) return broken_error();
  return check("all_reduce_max_f32", transport_->all_reduce_max(data, n));
}

absl::Status ProcessGroup::all_gather(const void* send, size_t bytes, void* recv) {
  if (broken_.load()) return broken_error();
  return check("all_gather", transport_->all_gather(send, bytes, recv));
}

absl::Status check_group_backend(const ssa_runtime_options& o, const std::vector<int32_t>& devices) {
  if (devices.size() > 1) {
    return unsupported("a group runtime (ssa_runtime_options.collective or .communicator) with a devices list of ",
                       devices.size(), " entries: a rank of a group holds one shard; pass no list");
  }
  if (o.backend == SSA_BACKEND_CUDA && o.device_kv_budget != 0) {
    return unsupported("device_kv_budget with a CUDA group runtime (ssa_runtime_options.collective or "
                       ".communicator): tiered sessions of a group are not implemented in this version; give "
                       "the group more ranks instead");
  }
  return absl::OkStatus();
}

absl::Status check_group_agreement(ProcessGroup& g, uint64_t shard_tokens, ssa_backend backend) {
  struct Claim {
    uint64_t rank, size, shard_tokens, version, backend;
  };
  constexpr uint64_t kVersion = (uint64_t{SSA_VERSION_MAJOR} << 32) | (uint64_t{SSA_VERSION_MINOR} << 16) |
                                uint64_t{SSA_VERSION_PATCH};
  const Claim mine{g.rank(), g.size(), shard_tokens, kVersion, static_cast<uint64_t>(backend)};
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
    if (c.version == mine.version && c.backend != mine.backend) {
      return invalid_argument("rank ", r, " of the group is a ", c.backend == SSA_BACKEND_CUDA ? "CUDA" : "CPU",
                              " runtime and rank ", g.rank(), " a ", backend == SSA_BACKEND_CUDA ? "CUDA" : "CPU",
                              " one: every rank of a group must use the same backend");
    }
    if (c.version != mine.version) {
      return unsupported("rank ", r, " runs libssa version code ", c.version, ", this rank ", mine.version,
                         ": every rank of a group must run the same version");
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa
