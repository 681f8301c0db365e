// A CUDA runtime made from the caller's NCCL communicator
// (ssa_runtime_options.communicator, docs/DISTRIBUTED.md), with the one rank
// this machine's first GPU gives (ncclCommInitAll over one device): the checks
// of the callback groups (support/gpu_group.h) with NCCL as the transport, its
// device buffers passed in place. Every method and group mode reads what an
// unsharded CUDA session reads, the output up to the attention's rounding;
// fork, truncate and regrowth across shards; the group's snapshot (a manifest
// and one rank file) loads into the same kind of runtime and into one process.
// Refusals: a communicator with the CPU backend, with a `collective` too, or
// of another device than the runtime's.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "ssa.h"
#include "support/gpu_group.h"
#include "support/gpu_sessions.h"
#include "support/snapshot_helpers.h"

namespace ssa::gputest {
namespace {

using group::Decoded;

bool has_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// A communicator of one rank on device 0, destroyed with it.
struct Comm {
  ncclComm_t c = nullptr;
  Comm() {
    const int dev = 0;
    REQUIRE(ncclCommInitAll(&c, 1, &dev) == ncclSuccess);
  }
  ~Comm() { ncclCommDestroy(c); }
};

ssa_runtime* nccl_runtime(ncclComm_t comm) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device = 0;
  o.seed = 1234;
  o.shard_tokens = group::kShard;
  o.communicator = comm;
  ssa_runtime* rt = nullptr;
  const ssa_status st = ssa_runtime_create(&o, &rt);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  CHECK(ssa_runtime_rank(rt) == 0);
  CHECK(ssa_runtime_num_shards(rt) == 1);
  CHECK(ssa_runtime_backend(rt) == SSA_BACKEND_CUDA);
  return rt;
}

ssa_runtime* plain_cuda() {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.seed = 1234;
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

TEST_CASE("nccl group of one rank: every method and group mode, fork, truncate, save and load") {
  if (!has_gpu()) return;
  Comm comm;
  const Data d = make_data(30000, 61);
  ssa_runtime* plain = plain_cuda();
  ssa_session* ref = group::new_session(plain, 0);
  REQUIRE(group::append_chunks(ref, d, 0, d.n, true) == SSA_OK);
  const std::vector<Decoded> want = group::decode_cases(ref, d, true);

  ssa_runtime* rt = nccl_runtime(comm.c);
  ssa_session* s = group::new_session(rt, 0);
  REQUIRE(group::append_chunks(s, d, 0, d.n, true) == SSA_OK);
  group::check_group_decodes({group::decode_cases(s, d, true)}, want);

  // Truncate into the second shard and grow back across the boundaries.
  const uint32_t cut = 12000;
  REQUIRE(ssa_session_truncate(s, cut) == SSA_OK);
  REQUIRE(ssa_session_truncate(ref, cut) == SSA_OK);
  group::check_group_decodes({group::decode_cases(s, d, true)}, group::decode_cases(ref, d, true));
  REQUIRE(group::append_chunks(s, d, cut, d.n, true) == SSA_OK);
  REQUIRE(group::append_chunks(ref, d, cut, d.n, true) == SSA_OK);
  const std::vector<Decoded> regrown = group::decode_cases(ref, d, true);
  const std::vector<Decoded> mine = group::decode_cases(s, d, true);
  group::check_group_decodes({mine}, regrown);

  // A fork decodes as its source.
  ssa_session* f = nullptr;
  REQUIRE(ssa_session_fork(s, &f) == SSA_OK);
  const std::vector<Decoded> forked = group::decode_cases(f, d, true);
  for (size_t i = 0; i < mine.size(); ++i) CHECK(forked[i].out == mine[i].out);
  ssa_session_destroy(f);

  // The group's snapshot into the same kind of runtime and into one process.
  const std::string path = ssa::test::temp_dir() + "/nccl.ssa";
  REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);
  ssa_session* l = nullptr;
  REQUIRE(ssa_session_load(rt, path.c_str(), 0, &l) == SSA_OK);
  const std::vector<Decoded> reloaded = group::decode_cases(l, d, true);
  for (size_t i = 0; i < mine.size(); ++i) CHECK(reloaded[i].out == mine[i].out);
  ssa_session_destroy(l);
  REQUIRE(ssa_session_load(plain, path.c_str(), 0, &l) == SSA_OK);
  const std::vector<Decoded> single = group::decode_cases(l, d, true);
  for (size_t i = 0; i < regrown.size(); ++i) CHECK(single[i].out == regrown[i].out);
  ssa_session_destroy(l);

  ssa_session_destroy(s);
  ssa_runtime_destroy(rt);
  ssa_session_destroy(ref);
  ssa_runtime_destroy(plain);
}

TEST_CASE("nccl group: refusals before the communicator is used") {
  if (!has_gpu()) return;
  Comm comm;
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CPU);
  o.communicator = comm.c;
  ssa_runtime* rt = nullptr;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
  ssa_collective table;
  ssa_collective_init(&table);
  o.backend = SSA_BACKEND_CUDA;
  o.collective = &table;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
  o.collective = nullptr;
  o.device_kv_budget = uint64_t{1} << 30;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_UNSUPPORTED);
  CHECK(rt == nullptr);
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  if (gpus > 1) {
    o.device_kv_budget = 0;
    o.device = 1;  // the communicator's device is 0
    CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(rt == nullptr);
  }
}

}  // namespace
}  // namespace ssa::gputest
