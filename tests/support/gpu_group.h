// The checks of CUDA runtimes that are ranks of a group of processes
// (docs/DISTRIBUTED.md), shared by the GPU test over the in-memory transport
// (tests/gpu/test_gpu_process_group.cc) and the one over NCCL
// (tests/gpu/nccl/test_gpu_nccl_group.cc): appends in chunks that end inside
// shards and across their boundaries, every method and group mode decoded with
// stats, compared across ranks (bitwise) and with an unsharded CUDA session of
// the same rows (the same reads, the output up to the rounding of where the
// attention's splits fall). Helpers called on the ranks' threads record
// statuses and use CHECK only (a REQUIRE would end a thread, not a test).
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_sessions.h"
#include "ssa.h"

namespace ssa::gputest::group {

constexpr uint64_t kShard = 8192;

struct Case {
  ssa_method method;
  uint32_t budget;
  ssa_group_selection group;
  uint32_t n_sink = 128;
};

// DENSE, the top-k and the sampling methods, per head and with both group
// modes; sink counts that put a rank's first token inside a page.
inline const Case kCases[] = {
    {SSA_METHOD_DENSE, 0, SSA_GROUP_OFF},
    {SSA_METHOD_ORACLE_TOPK, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_PQ_TOPK, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_PQ_TOPK, 700, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_ORACLE_TOPK, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_PQ_TOPK, 256, SSA_GROUP_OFF},  // sink and local only
    {SSA_METHOD_SSA, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_SSA, 1800, SSA_GROUP_OFF, 100},
    {SSA_METHOD_SAMPLING, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_HYBRID_UNIFORM, 1800, SSA_GROUP_OFF, 100},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_SSA_ADAPTIVE, 1800, SSA_GROUP_OFF},
    {SSA_METHOD_SSA_ADAPTIVE, 900, SSA_GROUP_MEAN_QUERY},
    {SSA_METHOD_PQ_TOPK, 700, SSA_GROUP_MIXTURE},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MIXTURE},
    {SSA_METHOD_SSA, 900, SSA_GROUP_MIXTURE, 100},
    {SSA_METHOD_ORACLE_TOPK, 900, SSA_GROUP_MIXTURE},
};

inline ssa_decode_params case_params(const Case& c, uint64_t step) {
  ssa_decode_params p = params(c.method, c.budget, step);
  p.group_selection = c.group;
  p.n_sink = c.n_sink;
  return p;
}

// The sessions of the tests (gpu_sessions.h's config), without REQUIRE.
inline ssa_session* new_session(ssa_runtime* rt, uint32_t flags) {
  ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  c.page_tokens = 128;
  c.flags = flags;
  c.index_min_tokens = 1024;
  c.index_regrow_factor = 4.0f;
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_create(rt, &c, &s);
  CHECK_MESSAGE(st == SSA_OK, ssa_last_error_message());
  return s;
}

// A device copy of host data, freed with it (CHECK only).
struct DeviceCopy {
  void* p = nullptr;
  DeviceCopy(const void* host, size_t bytes) {
    CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)) == cudaSuccess);
    CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  ~DeviceCopy() { cudaFree(p); }
};

// Tokens [from, to) of d in chunks of 5000, 7000, 9000 and 1 tokens (their
// ends fall inside shards and across their boundaries), from device memory
// unless the session takes host pointers. The first failing status.
inline ssa_status append_chunks(ssa_session* s, const Data& d, uint32_t from, uint32_t to, bool device) {
  const size_t row = size_t{kNkv} * kD;
  const uint32_t chunks[] = {5000, 7000, 9000, 1};
  for (uint32_t t = from, i = 0; t < to; ++i) {
    const uint32_t e = std::min(to, t + chunks[i % 4]);
    const size_t bytes = size_t{e - t} * row * sizeof(uint16_t);
    ssa_status st;
    if (device) {
      DeviceCopy k(d.k.data() + t * row, bytes), v(d.v.data() + t * row, bytes);
      st = ssa_session_append(s, 0, k.p, v.p, e - t);
    } else {
      st = ssa_session_append(s, 0, d.k.data() + t * row, d.v.data() + t * row, e - t);
    }
    if (st != SSA_OK) return st;
    t = e;
  }
  return SSA_OK;
}

struct Decoded {
  ssa_status st = SSA_OK;
  std::string message;
  std::vector<uint16_t> out;
  ssa_decode_stats stats{};
};

// One decode with device q/out (or host ones for a host-pointer session).
inline Decoded decode_on(ssa_session* s, const Data& d, const ssa_decode_params& p, bool device) {
  Decoded r;
  r.out.assign(size_t{kNq} * kD, 0xffff);
  ssa_decode_stats_init(&r.stats);
  if (device) {
    DeviceCopy q(d.q.data(), d.q.size() * sizeof(uint16_t)), o(r.out.data(), r.out.size() * sizeof(uint16_t));
    r.st = ssa_decode(s, 0, q.p, o.p, &p, &r.stats);
    CHECK(cudaMemcpy(r.out.data(), o.p, r.out.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  } else {
    r.st = ssa_decode(s, 0, d.q.data(), r.out.data(), &p, &r.stats);
  }
  if (r.st != SSA_OK) r.message = ssa_last_error_message();
  return r;
}

// Every case decoded (step `step`).
inline std::vector<Decoded> decode_cases(ssa_session* s, const Data& d, bool device, uint64_t step = 5) {
  std::vector<Decoded> all;
  for (const Case& c : kCases) all.push_back(decode_on(s, d, case_params(c, step), device));
  return all;
}

inline double rel_out(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) { return rel(a, b); }

// Main thread: every rank's decodes succeeded and are bitwise rank 0's; rank
// 0's read the reference's tokens (the same stats) and give its output up to
// the attention's rounding (2e-3 relative, as in-process shards).
inline void check_group_decodes(const std::vector<std::vector<Decoded>>& ranks, const std::vector<Decoded>& ref) {
  REQUIRE(!ranks.empty());
  for (size_t i = 0; i < ref.size(); ++i) {
    const Case& c = kCases[i];
    INFO("method ", c.method, " budget ", c.budget, " group ", c.group, " sink ", c.n_sink, " ranks ",
         ranks.size());
    REQUIRE(ref[i].st == SSA_OK);
    for (size_t r = 0; r < ranks.size(); ++r) {
      INFO("rank ", r, ": ", ranks[r][i].message);
      REQUIRE(ranks[r][i].st == SSA_OK);
      CHECK(ranks[r][i].out == ranks[0][i].out);
      CHECK(ranks[r][i].stats.tokens_read == ranks[0][i].stats.tokens_read);
    }
    const Decoded& got = ranks[0][i];
    const Decoded& want = ref[i];
    INFO("rel ", rel(got.out, want.out));
    CHECK(got.stats.context_tokens == want.stats.context_tokens);
    CHECK(got.stats.tokens_read == want.stats.tokens_read);
    CHECK(got.stats.heavy_tokens == want.stats.heavy_tokens);
    CHECK(got.stats.scored_tokens == want.stats.scored_tokens);
    CHECK(got.stats.draws == want.stats.draws);
    CHECK(got.stats.unique_samples == want.stats.unique_samples);
    CHECK(got.stats.residual_proxy_mass == doctest::Approx(want.stats.residual_proxy_mass).epsilon(1e-6));
    CHECK(rel(got.out, want.out) < 2e-3);
    // A group of one runs the sharded pipeline with one rank: the same splits
    // as the unsharded launch set, so bitwise where the path allows (reported,
    // not required).
    if (ranks.size() == 1) WARN(got.out == want.out);
  }
}

}  // namespace ssa::gputest::group
