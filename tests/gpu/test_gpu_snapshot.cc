// Snapshots of CUDA sessions (host staging) and interoperability with the CPU
// backend: a snapshot saved on either backend loads on the other and decodes the
// same; incremental checkpoints of a CUDA session; and injected device-memory
// exhaustion on append, update_index, decode and load: each failure is
// SSA_ERR_OUT_OF_MEMORY and leaves the session exactly as it was.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <stdio.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "support/gpu_sessions.h"
#include "cuda/device_alloc.h"
#include "support/gpu_layer.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

const ssa_method kAllMethods[] = {SSA_METHOD_DENSE,          SSA_METHOD_ORACLE_TOPK,
                                  SSA_METHOD_PQ_TOPK,        SSA_METHOD_HYBRID_UNIFORM,
                                  SSA_METHOD_SAMPLING,       SSA_METHOD_SSA,
                                  SSA_METHOD_SSA_ADAPTIVE};

std::string temp_path(const char* name) {
  return std::string(P_tmpdir) + "/ssa_gpu_" + std::to_string(getpid()) + "_" + name;
}

ssa_session* load(ssa_runtime* rt, const std::string& path, uint32_t flags = 0) {
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_load(rt, path.c_str(), flags, &s);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return s;
}

// Every method's output (host q/out through a host-pointer session, device
// buffers otherwise), budget 900, RNG step 3.
std::vector<std::vector<uint16_t>> all_outputs(ssa_session* s, const Data& d, bool device) {
  std::vector<std::vector<uint16_t>> outs;
  for (ssa_method m : kAllMethods) outs.push_back(decode(s, d, params(m, 900, 3), device));
  return outs;
}

TEST_CASE("gpu snapshots: CUDA sessions save and load, and snapshots move between backends") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(7000, 31);
  const std::string a = temp_path("a.ssa"), b = temp_path("b.ssa"), c = temp_path("c.ssa");

  ssa_session* sd = session(gpu, 0);  // device pointers, index trained on the GPU
  fill(sd, d, true);
  const auto ref = all_outputs(sd, d, true);
  REQUIRE(ssa_session_save(sd, a.c_str()) == SSA_OK);

  SUBCASE("CUDA -> CUDA: every method decodes bitwise the same") {
    ssa_session* ld = load(gpu, a);
    CHECK(ssa_session_length(ld) == d.n);
    CHECK(all_outputs(ld, d, true) == ref);
    ssa_session_destroy(ld);
  }

  SUBCASE("CUDA -> CPU -> CUDA: the CPU backend reads the GPU's pages and codes") {
    ssa_session* lc = load(cpu, a);
    CHECK(ssa_session_length(lc) == d.n);
    // Same K/V: DENSE agrees; same codebooks and codes: PQ top-k selects the same
    // tokens up to ties, so the outputs agree to f16 rounding.
    CHECK(rel(decode(lc, d, params(SSA_METHOD_DENSE, 0), false), ref[0]) < 2e-3);
    CHECK(rel(decode(lc, d, params(SSA_METHOD_PQ_TOPK, 900, 3), false), ref[2]) < 2e-3);
    // The CPU's save of what it loaded holds the same bytes: back on the GPU,
    // bitwise the original decodes.
    REQUIRE(ssa_session_save(lc, b.c_str()) == SSA_OK);
    ssa_session* ld = load(gpu, b);
    CHECK(all_outputs(ld, d, true) == ref);
    ssa_session_destroy(ld);
    ssa_session_destroy(lc);
  }

  SUBCASE("CPU -> CUDA: a session indexed on the CPU decodes on the GPU") {
    ssa_session* sc = session(cpu, SSA_SESSION_HOST_POINTERS);
    fill(sc, d, false);
    const auto dense_cpu = decode(sc, d, params(SSA_METHOD_DENSE, 0), false);
    const auto pq_cpu = decode(sc, d, params(SSA_METHOD_PQ_TOPK, 900, 3), false);
    REQUIRE(ssa_session_save(sc, c.c_str()) == SSA_OK);
    ssa_session* lh = load(gpu, c);  // flags travel: host pointers
    CHECK(rel(decode(lh, d, params(SSA_METHOD_DENSE, 0), false), dense_cpu) < 2e-3);
    CHECK(rel(decode(lh, d, params(SSA_METHOD_PQ_TOPK, 900, 3), false), pq_cpu) < 2e-3);
    // Appends to the loaded session keep encoding with the CPU's codebooks.
    fill(lh, make_data(500, 77), false);
    CHECK(ssa_session_length(lh) == d.n + 500);
    ssa_session_destroy(lh);
    ssa_session_destroy(sc);
  }

  SUBCASE("checkpoints of a CUDA session append only the new pages") {
    ssa_snapshot_info before;
    ssa_snapshot_info_init(&before);
    REQUIRE(ssa_snapshot_inspect(a.c_str(), &before) == SSA_OK);
    fill(sd, make_data(300, 9), true);
    const auto dense_now = decode(sd, d, params(SSA_METHOD_DENSE, 0), true);
    const auto ssa_now = decode(sd, d, params(SSA_METHOD_SSA, 900, 3), true);
    REQUIRE(ssa_session_checkpoint(sd, a.c_str()) == SSA_OK);
    ssa_snapshot_info after;
    ssa_snapshot_info_init(&after);
    REQUIRE(ssa_snapshot_inspect(a.c_str(), &after) == SSA_OK);
    CHECK(after.generation == before.generation + 1);
    CHECK(after.length == d.n + 300);
    // Far less than the whole session was written.
    CHECK(after.file_bytes - before.file_bytes < before.file_bytes / 4);
    ssa_session* ld = load(gpu, a);
    CHECK(decode(ld, d, params(SSA_METHOD_DENSE, 0), true) == dense_now);
    CHECK(decode(ld, d, params(SSA_METHOD_SSA, 900, 3), true) == ssa_now);
    ssa_session_destroy(ld);
  }

  SUBCASE("a mapped snapshot decodes as the loaded one, in place or through staged rows") {
    int pageable = 0;
    REQUIRE(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0) == cudaSuccess);
    MESSAGE("pageable memory access: ", pageable, pageable ? " (read in place)" : " (rows staged)");
    ssa_session* s = nullptr;
    const ssa_status st = ssa_session_load(gpu, a.c_str(), SSA_LOAD_MMAP, &s);
    INFO(ssa_last_error_message());
    REQUIRE(st == SSA_OK);
    ssa_session* ld = load(gpu, a);
    CHECK(all_outputs(s, d, true) == all_outputs(ld, d, true));
    ssa_decode_stats stats;
    ssa_decode_stats_init(&stats);
    decode(s, d, params(SSA_METHOD_SSA, 900, 3), true, &stats);
    CHECK(stats.rows_from_host > 0);  // read from the file's pages
    if (!pageable) {
      // Staged decodes copy rows on the host mid-decode: a graph cannot replay that.
      DevBuf<uint16_t> q(d.q.size()), o(d.q.size());
      q.upload(d.q);
      cudaStream_t cs;
      REQUIRE(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) == cudaSuccess);
      REQUIRE(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      ssa_decode_params p = params(SSA_METHOD_SSA, 900, 3);
      p.stream = cs;
      CHECK(ssa_decode(s, 0, q.p, o.p, &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
      CHECK(std::string(ssa_last_error_message()).find("graph") != std::string::npos);
      cudaGraph_t g = nullptr;
      REQUIRE(cudaStreamEndCapture(cs, &g) == cudaSuccess);
      if (g != nullptr) cudaGraphDestroy(g);
      cudaStreamDestroy(cs);
    }
    // Appends copy the mapped last page before writing (copy-on-write).
    fill(s, d, true);
    fill(ld, d, true);
    CHECK(all_outputs(s, d, true) == all_outputs(ld, d, true));
    ssa_session_destroy(ld);
    ssa_session_destroy(s);
  }

  ssa_session_destroy(sd);
  for (const std::string& p : {a, b, c}) unlink(p.c_str());
  ssa_runtime_destroy(cpu);
  ssa_runtime_destroy(gpu);
}

// Fails the n-th device allocation for n = 1, 2, ... until `op` succeeds; after
// every failure `unchanged` must hold. Returns the number of fault points hit.
template <typename Op, typename Unchanged>
int fail_each_device_allocation(Op op, Unchanged unchanged) {
  for (int n = 1; n < 10000; ++n) {
    cuda::set_device_alloc_failure_countdown(n, false);
    const ssa_status st = op();
    cuda::set_device_alloc_failure_countdown(0, false);
    if (st == SSA_OK) return n - 1;
    INFO("device allocation ", n, ": ", ssa_last_error_message());
    REQUIRE(st == SSA_ERR_OUT_OF_MEMORY);
    unchanged();
  }
  FAIL("the operation never succeeded");
  return 0;
}

TEST_CASE("gpu backend: score-aware weights are refused at create and load, CPU files still load there") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  // Every proxy runs on CUDA sessions (tests/gpu/test_gpu_proxies.cc); the
  // score-aware loss trains and encodes on the CPU backend only.
  const Data d = make_data(3000, 42);
  for (ssa_proxy proxy : {SSA_PROXY_PQ, SSA_PROXY_OPQ}) {
    CAPTURE(proxy);
    ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
    c.index_min_tokens = 1024;
    c.proxy = proxy;
    c.pq_parallel_weight = 4.0f;
    ssa_session* s = nullptr;
    CHECK(ssa_session_create(gpu, &c, &s) == SSA_ERR_UNSUPPORTED);
    CHECK(s == nullptr);
    CHECK(std::string(ssa_last_error_message()).find("pq_parallel_weight") != std::string::npos);
    REQUIRE(ssa_session_create(cpu, &c, &s) == SSA_OK);
    fill(s, d, false);
    const std::string path = temp_path("weighted.ssa");
    REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);
    ssa_session_destroy(s);
    ssa_session* loaded = nullptr;
    CHECK(ssa_session_load(gpu, path.c_str(), 0, &loaded) == SSA_ERR_UNSUPPORTED);
    CHECK(loaded == nullptr);
    CHECK(std::string(ssa_last_error_message()).find("pq_parallel_weight") != std::string::npos);
    loaded = load(cpu, path);
    ssa_session_destroy(loaded);
    unlink(path.c_str());
  }
  ssa_runtime_destroy(gpu);
  ssa_runtime_destroy(cpu);
}

TEST_CASE("gpu backend: device memory exhaustion leaves sessions unchanged") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(5000, 41);
  ssa_session* s = session(gpu, SSA_SESSION_HOST_POINTERS);
  fill(s, d, false);
  const auto ref = all_outputs(s, d, false);
  auto unchanged = [&] {
    CHECK(ssa_session_length(s) == d.n);
    CHECK(all_outputs(s, d, false) == ref);
  };
  const std::string path = temp_path("oom.ssa");
  REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);

  // Decode: the workspace, page tables and codebook copies are device allocations.
  ssa_session* fresh = load(gpu, path);
  std::vector<uint16_t> out(kNq * kD);
  const ssa_decode_params p = params(SSA_METHOD_SSA, 900, 3);
  const int decode_points = fail_each_device_allocation(
      [&] { return ssa_decode(fresh, 0, d.q.data(), out.data(), &p, nullptr); },
      [&] { CHECK(ssa_session_length(fresh) == d.n); });
  CHECK(out == ref[5]);
  ssa_session_destroy(fresh);

  // Append into a partly filled page (copy-on-write of a page a fork shares),
  // new pages and codes.
  ssa_session* fork = nullptr;
  REQUIRE(ssa_session_fork(s, &fork) == SSA_OK);
  const Data more = make_data(700, 42);
  const int append_points = fail_each_device_allocation(
      [&] { return ssa_session_append(s, 0, more.k.data(), more.v.data(), more.n); }, unchanged);
  CHECK(ssa_session_length(s) == d.n + more.n);
  REQUIRE(ssa_session_truncate(s, d.n) == SSA_OK);
  CHECK(all_outputs(fork, d, false) == ref);

  // Retraining: k-means workspace, codebooks, code pages.
  const int index_points = fail_each_device_allocation(
      [&] { return ssa_session_update_index(fork); },
      [&] { CHECK(all_outputs(fork, d, false) == ref); });

  // Load: every page upload; no session is returned on failure.
  ssa_session* loaded = nullptr;
  const int load_points = fail_each_device_allocation(
      [&] { return ssa_session_load(gpu, path.c_str(), 0, &loaded); },
      [&] { CHECK(loaded == nullptr); });
  REQUIRE(loaded != nullptr);
  CHECK(all_outputs(loaded, d, false) == ref);

  MESSAGE("device fault points: decode ", decode_points, ", append ", append_points,
          ", update_index ", index_points, ", load ", load_points);
  CHECK(decode_points >= 2);
  CHECK(append_points >= 2);
  CHECK(index_points >= 3);
  CHECK(load_points >= 2);

  ssa_session_destroy(loaded);
  ssa_session_destroy(fork);
  ssa_session_destroy(s);
  unlink(path.c_str());
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
