// CUDA runtimes as ranks of a group of processes (ssa_runtime_options.collective,
// docs/DISTRIBUTED.md), run here as threads of one process, every rank on
// device 0, over the in-memory transport of the CPU group tests
// (support/memory_transport.h: host buffers, the library stages device buffers
// through host memory). Groups of 1 to 4 ranks: every method and group mode
// decodes bitwise the same on every rank and reads what an unsharded CUDA
// session of the same rows reads, its output up to the attention's rounding
// (support/gpu_group.h); appends in chunks crossing shard boundaries, index
// training on the gathered sample, decode_batch, fork and truncate; a group's
// snapshot (manifest and a file per rank) saved by N ranks loads into M ranks
// (1..4), into one CUDA process and into a CPU group; a rank that leaves gives
// the others SSA_ERR_IO within the timeout and the group refuses later calls;
// what a CUDA group does not do is refused with SSA_ERR_UNSUPPORTED.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "ssa.h"
#include "support/gpu_group.h"
#include "support/gpu_sessions.h"
#include "support/memory_transport.h"
#include "support/snapshot_helpers.h"

namespace ssa::gputest {
namespace {

using namespace ssa_test::transport;
using group::Decoded;
using group::kShard;

// A CUDA rank on device 0 (CHECK only: called on the ranks' threads).
ssa_runtime* rank_runtime(RankLink* link, ssa_backend backend = SSA_BACKEND_CUDA, uint32_t timeout_ms = 60000) {
  ssa_collective c = table_of(link, timeout_ms);
  ssa_runtime_options o = ssa_test::runtime_options(backend);
  o.device = 0;
  o.seed = 1234;
  o.shard_tokens = kShard;
  o.collective = &c;
  ssa_runtime* rt = nullptr;
  const ssa_status st = ssa_runtime_create(&o, &rt);
  CHECK_MESSAGE(st == SSA_OK, ssa_last_error_message());
  return rt;
}

ssa_runtime* plain_runtime(ssa_backend backend = SSA_BACKEND_CUDA) {
  ssa_runtime_options o = ssa_test::runtime_options(backend);
  o.seed = 1234;
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

// The unsharded reference: the same rows in the same chunks (the index trains
// at the same lengths).
struct Reference {
  ssa_runtime* rt = plain_runtime();
  ssa_session* s = nullptr;
  Reference(const Data& d, uint32_t flags, bool device) {
    s = group::new_session(rt, flags);
    REQUIRE(s != nullptr);
    REQUIRE(group::append_chunks(s, d, 0, d.n, device) == SSA_OK);
  }
  ~Reference() {
    ssa_session_destroy(s);
    ssa_runtime_destroy(rt);
  }
};

TEST_CASE("gpu process group: every method and group mode, bitwise on every rank, as one process reads") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(30000, 41);
  Reference ref(d, 0, true);
  const std::vector<Decoded> want = group::decode_cases(ref.s, d, true);
  for (uint32_t ranks = 1; ranks <= 4; ++ranks) {
    INFO("ranks ", ranks);
    std::vector<std::vector<Decoded>> got(ranks), batched(ranks);
    std::vector<uint32_t> rank_of(ranks, 99), shards(ranks, 0);
    std::vector<ssa_status> appended(ranks, SSA_ERR_INTERNAL);
    run_ranks(ranks, [&](uint32_t r, RankLink& link) {
      ssa_runtime* rt = rank_runtime(&link);
      if (rt == nullptr) return;
      rank_of[r] = ssa_runtime_rank(rt);
      shards[r] = ssa_runtime_num_shards(rt);
      ssa_session* s = group::new_session(rt, 0);
      appended[r] = group::append_chunks(s, d, 0, d.n, true);
      got[r] = group::decode_cases(s, d, true);
      // decode_batch: each item a collective call, bitwise its own decode.
      ssa_session* f = nullptr;
      CHECK(ssa_session_fork(s, &f) == SSA_OK);
      CHECK(ssa_session_truncate(f, 9000) == SSA_OK);
      for (const group::Case& c : group::kCases) {
        const ssa_decode_params p = group::case_params(c, 5);
        std::vector<uint16_t> o0(size_t{kNq} * kD, 0xffff), o1(o0.size(), 0xffff);
        Decoded one;
        // Device q/out, as the sessions take them.
        group::DeviceCopy q(d.q.data(), d.q.size() * 2), a(o0.data(), o0.size() * 2), b(o1.data(), o1.size() * 2);
        const ssa_decode_item dev_items[] = {{s, q.p, a.p}, {f, q.p, b.p}};
        one.st = ssa_decode_batch(dev_items, 2, 0, &p);
        if (one.st != SSA_OK) one.message = ssa_last_error_message();
        CHECK(cudaMemcpy(o0.data(), a.p, o0.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(cudaMemcpy(o1.data(), b.p, o1.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
        one.out = o0;
        batched[r].push_back(one);
        const Decoded fork_alone = group::decode_on(f, d, p, true);
        CHECK(fork_alone.st == SSA_OK);
        CHECK(fork_alone.out == o1);
      }
      ssa_session_destroy(f);
      ssa_session_destroy(s);
      ssa_runtime_destroy(rt);
    });
    for (uint32_t r = 0; r < ranks; ++r) {
      CHECK(rank_of[r] == r);
      CHECK(shards[r] == ranks);
      REQUIRE(appended[r] == SSA_OK);
    }
    group::check_group_decodes(got, want);
    for (uint32_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < batched[r].size(); ++i) {
        INFO("batch item 0, case ", i, ": ", batched[r][i].message);
        REQUIRE(batched[r][i].st == SSA_OK);
        CHECK(batched[r][i].out == got[r][i].out);
      }
    }
  }
}

TEST_CASE("gpu process group: host rows, truncate into a shard, appends across it, fork") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(26000, 43);
  const uint32_t cut = 12000;  // inside the second shard: the third and fourth empty
  Reference ref(d, SSA_SESSION_HOST_POINTERS, false);
  REQUIRE(ssa_session_truncate(ref.s, cut) == SSA_OK);
  const std::vector<Decoded> at_cut = group::decode_cases(ref.s, d, false);
  REQUIRE(group::append_chunks(ref.s, d, cut, d.n, false) == SSA_OK);
  const std::vector<Decoded> regrown = group::decode_cases(ref.s, d, false);
  for (uint32_t ranks : {2u, 3u, 4u}) {
    INFO("ranks ", ranks);
    std::vector<std::vector<Decoded>> a(ranks), b(ranks), forked(ranks), source(ranks);
    run_ranks(ranks, [&](uint32_t r, RankLink& link) {
      ssa_runtime* rt = rank_runtime(&link);
      if (rt == nullptr) return;
      ssa_session* s = group::new_session(rt, SSA_SESSION_HOST_POINTERS);
      CHECK(group::append_chunks(s, d, 0, d.n, false) == SSA_OK);
      CHECK(ssa_session_truncate(s, cut) == SSA_OK);
      a[r] = group::decode_cases(s, d, false);
      CHECK(group::append_chunks(s, d, cut, d.n, false) == SSA_OK);
      b[r] = group::decode_cases(s, d, false);
      // A fork decodes as its source; truncating it leaves the source as it was.
      ssa_session* f = nullptr;
      CHECK(ssa_session_fork(s, &f) == SSA_OK);
      forked[r] = group::decode_cases(f, d, false);
      CHECK(ssa_session_truncate(f, 9000) == SSA_OK);
      source[r] = group::decode_cases(s, d, false);
      ssa_session_destroy(f);
      ssa_session_destroy(s);
      ssa_runtime_destroy(rt);
    });
    group::check_group_decodes(a, at_cut);
    group::check_group_decodes(b, regrown);
    for (uint32_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < b[r].size(); ++i) {
        CHECK(forked[r][i].out == b[r][i].out);
        CHECK(source[r][i].out == b[r][i].out);
      }
    }
  }
}

TEST_CASE("gpu process group: saved by N ranks, loaded by M ranks, by one process and by a CPU group") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(30000, 47);
  Reference ref(d, SSA_SESSION_HOST_POINTERS, false);
  const std::vector<Decoded> want = group::decode_cases(ref.s, d, false);
  const std::string dir = ssa::test::temp_dir();
  for (uint32_t saved_by = 1; saved_by <= 4; ++saved_by) {
    INFO("saved by ", saved_by, " ranks");
    const std::string path = dir + "/group" + std::to_string(saved_by) + ".ssa";
    std::vector<ssa_status> saved(saved_by, SSA_ERR_INTERNAL);
    run_ranks(saved_by, [&](uint32_t r, RankLink& link) {
      ssa_runtime* rt = rank_runtime(&link);
      if (rt == nullptr) return;
      ssa_session* s = group::new_session(rt, SSA_SESSION_HOST_POINTERS);
      CHECK(group::append_chunks(s, d, 0, d.n, false) == SSA_OK);
      saved[r] = ssa_session_save(s, path.c_str());
      ssa_session_destroy(s);
      ssa_runtime_destroy(rt);
    });
    for (ssa_status st : saved) REQUIRE(st == SSA_OK);
    for (uint32_t loaded_by = 1; loaded_by <= 4; ++loaded_by) {
      INFO("loaded by ", loaded_by, " ranks");
      std::vector<std::vector<Decoded>> got(loaded_by);
      std::vector<ssa_status> loaded(loaded_by, SSA_ERR_INTERNAL);
      run_ranks(loaded_by, [&](uint32_t r, RankLink& link) {
        ssa_runtime* rt = rank_runtime(&link);
        if (rt == nullptr) return;
        ssa_session* s = nullptr;
        loaded[r] = ssa_session_load(rt, path.c_str(), 0, &s);
        if (loaded[r] == SSA_OK) {
          CHECK(ssa_session_length(s) == d.n);
          got[r] = group::decode_cases(s, d, false);
        }
        ssa_session_destroy(s);
        ssa_runtime_destroy(rt);
      });
      for (ssa_status st : loaded) REQUIRE(st == SSA_OK);
      group::check_group_decodes(got, want);
    }
    // Into one CUDA process: the unsharded session's decode.
    ssa_runtime* one = plain_runtime();
    ssa_session* s = nullptr;
    REQUIRE(ssa_session_load(one, path.c_str(), 0, &s) == SSA_OK);
    CHECK(ssa_session_length(s) == d.n);
    const std::vector<Decoded> single = group::decode_cases(s, d, false);
    for (size_t i = 0; i < want.size(); ++i) {
      REQUIRE(single[i].st == SSA_OK);
      CHECK(single[i].out == want[i].out);  // the same rows and codebooks: bitwise
    }
    ssa_session_destroy(s);
    ssa_runtime_destroy(one);
    // Into a CPU group of 2: the same DENSE output up to the backends' rounding.
    std::vector<Decoded> cpu(2);
    run_ranks(2, [&](uint32_t r, RankLink& link) {
      ssa_runtime* rt = rank_runtime(&link, SSA_BACKEND_CPU);
      if (rt == nullptr) return;
      ssa_session* l = nullptr;
      CHECK(ssa_session_load(rt, path.c_str(), 0, &l) == SSA_OK);
      if (l != nullptr) cpu[r] = group::decode_on(l, d, params(SSA_METHOD_DENSE, 0), false);
      ssa_session_destroy(l);
      ssa_runtime_destroy(rt);
    });
    REQUIRE(cpu[0].st == SSA_OK);
    REQUIRE(cpu[1].st == SSA_OK);
    CHECK(cpu[0].out == cpu[1].out);
    CHECK(rel(cpu[0].out, want[0].out) < 2e-3);
  }
}

TEST_CASE("gpu process group: a rank that leaves gives the others SSA_ERR_IO, not a hang") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(20000, 53);
  ssa_status first = SSA_OK, second = SSA_OK;
  double waited_ms = 0;
  std::string message;
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    ssa_runtime* rt = rank_runtime(&link, SSA_BACKEND_CUDA, 300);
    if (rt == nullptr) return;
    ssa_session* s = group::new_session(rt, 0);
    CHECK(group::append_chunks(s, d, 0, d.n, true) == SSA_OK);
    if (r == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      const Decoded a = group::decode_on(s, d, params(SSA_METHOD_SSA, 1800), true);
      waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      first = a.st;
      message = a.message;
      second = group::decode_on(s, d, params(SSA_METHOD_DENSE, 0), true).st;  // out of step: at once
    }
    // Rank 1 leaves the group here (makes no more calls).
    ssa_session_destroy(s);
    ssa_runtime_destroy(rt);
  });
  CHECK(first == SSA_ERR_IO);
  CHECK(second == SSA_ERR_IO);
  CHECK(message.find("timeout_ms 300") != std::string::npos);
  CHECK(waited_ms >= 250);
  CHECK(waited_ms < 20000);
}

TEST_CASE("gpu process group: what a CUDA group does not do is refused, on every rank, and changes nothing") {
  SSA_GPU_TEST_OR_SKIP();
  // Tiers and device lists: refused before any exchange.
  Transport t(2);
  RankLink link{&t, 0};
  ssa_collective c = table_of(&link);
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.collective = &c;
  o.device_kv_budget = uint64_t{1} << 30;
  ssa_runtime* rt = nullptr;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_UNSUPPORTED);
  o.device_kv_budget = 0;
  const int32_t devices[] = {0, 1};  // distinct (a repeated ordinal is invalid before the group is looked at)
  o.devices = devices;
  o.n_devices = 2;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_UNSUPPORTED);
  CHECK(rt == nullptr);
  CHECK(link.calls == 0);
  // Error targets, decode-step reservations, sink tokens past the first
  // shard's margin: refused on every rank. Device rows with a NaN in rank 1's
  // shard: every rank checks every row, so both refuse and nothing changes.
  const Data d = make_data(20000, 59);
  std::vector<ssa_status> target(2), reserve(2), sinks(2), nan_rows(2), after(2);
  std::vector<uint64_t> lengths(2);
  std::vector<std::vector<uint16_t>> outs(2);
  run_ranks(2, [&](uint32_t r, RankLink& l) {
    ssa_runtime* g = rank_runtime(&l);
    if (g == nullptr) return;
    ssa_session* s = group::new_session(g, 0);
    CHECK(group::append_chunks(s, d, 0, d.n, true) == SSA_OK);
    ssa_decode_params p = params(SSA_METHOD_SSA, 1800);
    p.target_error = 0.05f;
    target[r] = group::decode_on(s, d, p, true).st;
    reserve[r] = ssa_session_reserve(s, 16);
    // A budget beyond the sink tokens, so that the decode selects: rank 0's
    // chunk-aligned range would end at 10000, past its margin (9216).
    p = params(SSA_METHOD_SSA, 12000);
    p.n_sink = 10000;
    sinks[r] = group::decode_on(s, d, p, true).st;
    std::vector<uint16_t> k(d.k.begin(), d.k.begin() + 10000 * kNkv * kD), v(k.size());
    std::copy(d.v.begin(), d.v.begin() + static_cast<std::ptrdiff_t>(v.size()), v.begin());
    k[9000 * kNkv * kD + 3] = 0x7e00;  // f16 NaN at token 29000: rank 1 keeps it, rank 0 does not
    group::DeviceCopy dk(k.data(), k.size() * 2), dv(v.data(), v.size() * 2);
    nan_rows[r] = ssa_session_append(s, 0, dk.p, dv.p, 10000);
    lengths[r] = ssa_session_length(s);
    const Decoded a = group::decode_on(s, d, params(SSA_METHOD_PQ_TOPK, 1800), true);  // still in step
    after[r] = a.st;
    outs[r] = a.out;
    ssa_session_destroy(s);
    ssa_runtime_destroy(g);
  });
  for (uint32_t r = 0; r < 2; ++r) {
    CHECK(target[r] == SSA_ERR_UNSUPPORTED);
    CHECK(reserve[r] == SSA_ERR_UNSUPPORTED);
    CHECK(sinks[r] == SSA_ERR_UNSUPPORTED);
    CHECK(nan_rows[r] == SSA_ERR_INVALID_ARGUMENT);
    CHECK(lengths[r] == d.n);
    CHECK(after[r] == SSA_OK);
  }
  CHECK(outs[0] == outs[1]);
}

}  // namespace
}  // namespace ssa::gputest
