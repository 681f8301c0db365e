// Sharded CUDA sessions (docs/SHARDING.md) through the public C API: one shard
// per GPU of the machine, and several shards on one GPU where it has fewer
// (allow_repeated_shard_devices), against an unsharded CUDA session holding the
// same rows. DENSE, the top-k methods (ORACLE_TOPK, PQ_TOPK) and the sampling
// methods (SSA, SAMPLING, HYBRID_UNIFORM, SSA_ADAPTIVE), per head, with
// mean-query groups and with mixture groups, read exactly the unsharded tokens
// (the same stats, whose heavy and sample counts come from the shards' own read
// sets) and give its output up to the rounding of the attention's split
// boundaries, far closer than a read set differing by a few tokens would. A sink count that is not a
// multiple of the page size puts a rank's first token inside a page. Appends from
// device and host memory cross the shard boundaries; truncate, fork,
// decode_batch, save and load (on a runtime of another shard count, and
// unsharded) keep the decode; what is not sharded on the GPU (error targets)
// refuses with SSA_ERR_UNSUPPORTED and changes nothing.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "shard/shard_options.h"
#include "ssa.h"
#include "support/gpu_sessions.h"
#include "support/snapshot_helpers.h"

namespace ssa::gputest {
namespace {

constexpr uint64_t kShardTokens = 8192;

// A CUDA runtime with `shards` shards over the machine's GPUs, round robin.
ssa_runtime* sharded_runtime(uint32_t shards) {
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  std::vector<int32_t> devices(shards);
  for (uint32_t i = 0; i < shards; ++i) devices[i] = static_cast<int32_t>(i % static_cast<uint32_t>(gpus));
  ssa::allow_repeated_shard_devices(static_cast<uint32_t>(gpus) < shards);
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.devices = devices.data();
  o.n_devices = shards;
  o.shard_tokens = kShardTokens;
  ssa_runtime* rt = nullptr;
  const ssa_status st = ssa_runtime_create(&o, &rt);
  ssa::allow_repeated_shard_devices(false);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  REQUIRE(ssa_runtime_num_shards(rt) == shards);
  return rt;
}

void check_same_reads(const ssa_decode_stats& a, const ssa_decode_stats& b) {
  CHECK(a.context_tokens == b.context_tokens);
  CHECK(a.tokens_read == b.tokens_read);
  CHECK(a.heavy_tokens == b.heavy_tokens);
  CHECK(a.scored_tokens == b.scored_tokens);
  CHECK(a.draws == b.draws);
  CHECK(a.unique_samples == b.unique_samples);
  // Sums of doubles in another order (statistics only).
  CHECK(a.residual_proxy_mass == doctest::Approx(b.residual_proxy_mass).epsilon(1e-6));
}

struct Case {
  ssa_method method;
  uint32_t budget;
  ssa_group_selection group;
  uint32_t n_sink = 128;
};

const Case kCases[] = {
    {SSA_METHOD_DENSE, 0, SSA_GROUP_OFF},
    {SSA_METHOD_ORACLE_TOPK, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_PQ_TOPK, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_PQ_TOPK, 700, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_ORACLE_TOPK, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_PQ_TOPK, 256, SSA_GROUP_OFF},  // sink and local only
    {SSA_METHOD_SSA, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_SSA, 1800, SSA_GROUP_OFF, 100},  // ranks start inside pages
    {SSA_METHOD_SAMPLING, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_HYBRID_UNIFORM, 1800, SSA_GROUP_OFF, 100},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_PQ_TOPK, 1800, SSA_GROUP_OFF, 100},
    {SSA_METHOD_SSA_ADAPTIVE, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_SSA_ADAPTIVE, 1800, SSA_GROUP_OFF, 100},
    {SSA_METHOD_SSA_ADAPTIVE, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_PQ_TOPK, 700, SSA_GROUP_MIXTURE},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MIXTURE},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MIXTURE, 100},
    {SSA_METHOD_ORACLE_TOPK, 900, SSA_GROUP_MIXTURE},
};

// Every case on s and ref (device q/out unless host), outputs and stats compared.
void check_cases(ssa_session* s, ssa_session* ref, const Data& d, bool device) {
  const auto dense = decode(ref, d, params(SSA_METHOD_DENSE, 0), device);
  for (const Case& c : kCases) {
    ssa_decode_params p = params(c.method, c.budget, 5);
    p.group_selection = c.group;
    p.n_sink = c.n_sink;
    ssa_decode_stats a, b;
    ssa_decode_stats_init(&a);
    ssa_decode_stats_init(&b);
    const auto want = decode(ref, d, p, device, &b);
    const auto got = decode(s, d, p, device, &a);
    INFO("method ", c.method, " budget ", c.budget, " group ", c.group, " sink ", c.n_sink, " rel ",
         rel(got, want));
    check_same_reads(a, b);
    CHECK(rel(got, want) < 2e-3);
    // Fewer heavy tokens give a visibly different output: the comparison above
    // would catch a read set that is not the unsharded one.
    if (c.method != SSA_METHOD_DENSE) CHECK(rel(want, dense) > 1e-2);
    if (b.draws > 0) {
      // Other samples (another step's) give a visibly different output too: the
      // comparison above would catch samples that are not the unsharded ones.
      CHECK(b.unique_samples > 0);
      ssa_decode_params other = p;
      other.step = p.step + 1;
      const double by_samples = rel(decode(ref, d, other, device), want);
      INFO("another step's samples: rel ", by_samples);
      CHECK(by_samples > 1e-2);
    }
    // The same decode again: bitwise the same.
    CHECK(decode(s, d, p, device) == got);
  }
}

TEST_CASE("gpu sharded decode: DENSE, top-k and sampling methods read the unsharded session's tokens") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(30000, 31);
  ssa_session* ref = session(gpu, 0);
  fill(ref, d, true);
  for (uint32_t shards : {2u, 4u}) {
    INFO("shards ", shards);
    ssa_runtime* rt = sharded_runtime(shards);
    ssa_session* s = session(rt, 0);
    fill(s, d, true);  // the second append starts inside a page and crosses shards
    CHECK(ssa_session_length(s) == d.n);
    check_cases(s, ref, d, true);

    // Not sharded on the GPU: refused, and nothing changes.
    const auto before = decode(s, d, params(SSA_METHOD_PQ_TOPK, 1800), true);
    std::vector<uint16_t> out(kNq * kD);
    DevBuf<uint16_t> q(d.q.size()), o(out.size());
    q.upload(d.q);
    auto refused = [&](const ssa_decode_params& p, const char* words) {
      CHECK(ssa_decode(s, 0, q.p, o.p, &p, nullptr) == SSA_ERR_UNSUPPORTED);
      CHECK(std::string(ssa_last_error_message()).find(words) != std::string::npos);
    };
    ssa_decode_params p = params(SSA_METHOD_SSA, 1800);
    p.target_error = 0.05f;
    refused(p, "target_error");
    CHECK(ssa_session_length(s) == d.n);
    CHECK(decode(s, d, params(SSA_METHOD_PQ_TOPK, 1800), true) == before);
    ssa_session_destroy(s);
    ssa_runtime_destroy(rt);
  }
  ssa_session_destroy(ref);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu sharded sessions: host rows, truncate, fork, decode_batch, save and load") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* rt = sharded_runtime(3);
  const Data d = make_data(26000, 37);
  ssa_session* ref = session(gpu, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(rt, SSA_SESSION_HOST_POINTERS);
  fill(ref, d, false);
  fill(s, d, false);
  check_cases(s, ref, d, false);

  // Truncate into the second shard (the third empties), then grow back.
  const uint32_t cut = 12000;
  const size_t row = size_t{kNkv} * kD;
  REQUIRE(ssa_session_truncate(s, cut) == SSA_OK);
  REQUIRE(ssa_session_truncate(ref, cut) == SSA_OK);
  check_cases(s, ref, d, false);
  REQUIRE(ssa_session_append(s, 0, d.k.data() + cut * row, d.v.data() + cut * row, d.n - cut) == SSA_OK);
  REQUIRE(ssa_session_append(ref, 0, d.k.data() + cut * row, d.v.data() + cut * row, d.n - cut) == SSA_OK);
  check_cases(s, ref, d, false);

  // A fork shares the pages and decodes bitwise as its source; it grows alone.
  ssa_session* f = nullptr;
  REQUIRE(ssa_session_fork(s, &f) == SSA_OK);
  const ssa_decode_params pq = params(SSA_METHOD_PQ_TOPK, 1800, 2);
  const auto from_s = decode(s, d, pq, false);
  CHECK(decode(f, d, pq, false) == from_s);
  REQUIRE(ssa_session_truncate(f, 9000) == SSA_OK);
  CHECK(decode(s, d, pq, false) == from_s);

  // decode_batch over sharded sessions of different lengths (the fork is held by
  // two of the three shards): one launch set per shard over the items it holds,
  // the same reads as the unsharded batch of the same sessions.
  {
    ssa_session* rf = nullptr;
    REQUIRE(ssa_session_fork(ref, &rf) == SSA_OK);
    REQUIRE(ssa_session_truncate(rf, 9000) == SSA_OK);
    for (const Case& c : kCases) {
      ssa_decode_params p = params(c.method, c.budget, 3);
      p.group_selection = c.group;
      p.n_sink = c.n_sink;
      INFO("batch: method ", c.method, " budget ", c.budget, " group ", c.group, " sink ", c.n_sink);
      std::vector<uint16_t> o[4];
      for (auto& x : o) x.assign(size_t{kNq} * kD, 0xffff);
      const ssa_decode_item items[] = {{s, d.q.data(), o[0].data()}, {f, d.q.data(), o[1].data()}};
      const ssa_decode_item refs[] = {{ref, d.q.data(), o[2].data()}, {rf, d.q.data(), o[3].data()}};
      REQUIRE(ssa_decode_batch(items, 2, 0, &p) == SSA_OK);
      REQUIRE(ssa_decode_batch(refs, 2, 0, &p) == SSA_OK);
      CHECK(rel(o[0], o[2]) < 2e-3);
      CHECK(rel(o[1], o[3]) < 2e-3);
      // Each item as its own sharded decode (another split of the attention).
      CHECK(rel(o[0], decode(s, d, p, false)) < 2e-3);
      CHECK(rel(o[1], decode(f, d, p, false)) < 2e-3);
      const ssa_decode_item again[] = {{s, d.q.data(), o[2].data()}, {f, d.q.data(), o[3].data()}};
      REQUIRE(ssa_decode_batch(again, 2, 0, &p) == SSA_OK);
      CHECK(o[2] == o[0]);
      CHECK(o[3] == o[1]);
    }
    ssa_session_destroy(rf);
  }

  // One snapshot, loadable on any shard count (unsharded included), both ways.
  const std::string dir = ssa::test::temp_dir();
  const std::string path = dir + "/sharded.ssa";
  REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);
  ssa_runtime* rt2 = sharded_runtime(2);
  for (ssa_runtime* target : {gpu, rt2, rt}) {
    ssa_session* l = nullptr;
    REQUIRE(ssa_session_load(target, path.c_str(), 0, &l) == SSA_OK);
    CHECK(ssa_session_length(l) == d.n);
    check_cases(l, ref, d, false);
    ssa_session_destroy(l);
  }
  const std::string flat = dir + "/unsharded.ssa";
  REQUIRE(ssa_session_save(ref, flat.c_str()) == SSA_OK);
  ssa_session* l = nullptr;
  REQUIRE(ssa_session_load(rt2, flat.c_str(), 0, &l) == SSA_OK);
  check_cases(l, ref, d, false);
  ssa_session_destroy(l);

  ssa_session_destroy(f);
  ssa_session_destroy(s);
  ssa_session_destroy(ref);
  ssa_runtime_destroy(rt2);
  ssa_runtime_destroy(rt);
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
