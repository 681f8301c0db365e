// A tiered CUDA runtime with pre-pinned host memory
// (ssa_runtime_options.host_pool_bytes): the pool is page-locked at creation,
// sessions take their host pages from it before pinning anything new, decode
// bitwise as the same session held wholly on the device, and give its chunks
// back to the runtime (not to the OS) when they go; a pool that cannot be
// page-locked fails the creation with nothing kept.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/pinned_chunks.h"
#include "cuda/pinned_host.h"
#include "runtime.h"
#include "support/gpu_sessions.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

constexpr uint64_t kChunk = cuda::PinnedChunkPool::kChunkBytes;
const ssa_method kMethods[] = {SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA};

ssa_runtime* pooled_runtime(uint64_t budget, uint64_t pool) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = budget;
  o.host_pool_bytes = pool;
  ssa_runtime* rt = nullptr;
  const ssa_status st = ssa_runtime_create(&o, &rt);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return rt;
}

std::vector<std::vector<uint16_t>> outputs(ssa_session* s, const Data& d) {
  std::vector<std::vector<uint16_t>> outs;
  for (uint64_t step = 1; step <= 2; ++step)
    for (ssa_method m : kMethods) outs.push_back(decode(s, d, params(m, 600, step), true));
  return outs;
}

TEST_CASE("gpu host pool: sessions take host pages from the runtime's pinned chunks and give them back") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(12000, 21);
  const uint64_t live0 = cuda::pinned_chunk_bytes_live();
  // A fifth of the session's K/V on the device: most of it in the host tier
  // (128-token pages of 128 KiB: one chunk holds 512 of them).
  const uint64_t budget = uint64_t{d.n} * kNkv * kD * 2 * 2 / 5;
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* pooled = pooled_runtime(budget, kChunk);
  REQUIRE(pooled->host_pool != nullptr);
  CHECK(cuda::pinned_chunk_bytes_live() == live0 + kChunk);  // page-locked at creation
  CHECK(pooled->host_pool->free_bytes() == kChunk);
  ssa_session* u = session(flat, 0);
  fill(u, d, true);
  const auto ref = outputs(u, d);

  ssa_session* a = session(pooled, 0);
  fill(a, d, true);  // device rows into host pages: the fill's path
  CHECK(pooled->host_pool->free_bytes() == 0);  // a borrowed the only chunk
  ssa_decode_stats st;
  ssa_decode_stats_init(&st);
  decode(a, d, params(SSA_METHOD_DENSE, 0, 1), true, &st);
  CHECK(st.rows_from_host > 0);  // the pool's pages are read over the bus
  CHECK(outputs(a, d) == ref);

  // Every chunk lent: the next session pins its own, as without a pool.
  ssa_session* b = session(pooled, 0);
  fill(b, d, true);
  CHECK(outputs(b, d) == ref);
  CHECK(cuda::pinned_chunk_bytes_live() == live0 + kChunk);

  // a's chunk comes back to the runtime, not to the OS, and the next session takes it.
  ssa_session_destroy(a);
  CHECK(pooled->host_pool->free_bytes() == kChunk);
  CHECK(cuda::pinned_chunk_bytes_live() == live0 + kChunk);
  {
    // It comes back zeroed: the next session sees none of a's rows.
    void* chunk = pooled->host_pool->take();
    REQUIRE(chunk != nullptr);
    const uint8_t* bytes = static_cast<const uint8_t*>(chunk);
    CHECK(std::all_of(bytes, bytes + kChunk, [](uint8_t x) { return x == 0; }));
    pooled->host_pool->give_back(chunk);
  }
  ssa_session* c = session(pooled, 0);
  fill(c, d, true);
  CHECK(pooled->host_pool->free_bytes() == 0);
  CHECK(outputs(c, d) == ref);
  // A fork shares its source's pool: the chunk stays lent until both are gone.
  ssa_session* f = nullptr;
  REQUIRE(ssa_session_fork(c, &f) == SSA_OK);
  ssa_session_destroy(c);
  CHECK(pooled->host_pool->free_bytes() == 0);
  CHECK(outputs(f, d) == ref);
  ssa_session_destroy(f);
  CHECK(pooled->host_pool->free_bytes() == kChunk);

  ssa_session_destroy(b);
  ssa_session_destroy(u);
  ssa_runtime_destroy(pooled);
  CHECK(cuda::pinned_chunk_bytes_live() == live0);  // freed with the runtime
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu host pool: a pool that cannot be page-locked fails the creation and keeps nothing") {
  SSA_GPU_TEST_OR_SKIP();
  const uint64_t live0 = cuda::pinned_chunk_bytes_live();
  for (uint64_t at = 1; at <= 4; ++at) {
    INFO("chunk ", at, " fails");
    ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
    o.device_kv_budget = uint64_t{1} << 30;
    o.host_pool_bytes = 4 * kChunk;
    ssa_runtime* rt = nullptr;
    cuda::set_pinned_chunk_failure_countdown(at, false);
    const ssa_status st = ssa_runtime_create(&o, &rt);
    cuda::set_pinned_chunk_failure_countdown(0, false);
    CHECK(st == SSA_ERR_OUT_OF_MEMORY);
    CHECK(rt == nullptr);
    CHECK(std::string(ssa_last_error_message()).find("host_pool_bytes") != std::string::npos);
    CHECK(cuda::pinned_chunk_bytes_live() == live0);
  }
  ssa_runtime* rt = pooled_runtime(uint64_t{1} << 30, 4 * kChunk);
  CHECK(cuda::pinned_chunk_bytes_live() == live0 + 4 * kChunk);
  CHECK(rt->host_pool->bytes() == 4 * kChunk);
  ssa_runtime_destroy(rt);
  CHECK(cuda::pinned_chunk_bytes_live() == live0);
  // Invalid values are refused before anything is page-locked.
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = uint64_t{1} << 30;
  o.host_pool_bytes = kChunk + 1;
  rt = nullptr;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
  o.host_pool_bytes = kChunk;
  o.device_kv_budget = 0;
  CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(cuda::pinned_chunk_bytes_live() == live0);
}

// The host tier's memory (lib/cuda/pinned_host.h): zeroed, 2 MiB-aligned,
// page-locked and mapped at the host's address; copies through the device read
// and write it; given back, the range is no longer registered.
TEST_CASE("gpu host pool: pinned host memory is zeroed, aligned, mapped and given back") {
  SSA_GPU_TEST_OR_SKIP();
  for (size_t bytes : {size_t{1}, size_t{4096}, size_t{64} << 20, (size_t{65} << 20) + 1}) {
    CAPTURE(bytes);
    void* p = nullptr;
    REQUIRE(cuda::pin_host(bytes, &p) == cudaSuccess);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20) == 0);
    const auto* b = static_cast<const uint8_t*>(p);
    CHECK(std::all_of(b, b + bytes, [](uint8_t x) { return x == 0; }));
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);
    CHECK(attr.devicePointer == p);
    // A device round trip through the mapping: host -> device buffer -> host.
    std::vector<uint8_t> pattern(std::min<size_t>(bytes, 1 << 20));
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 131 + 7);
    memcpy(p, pattern.data(), pattern.size());
    DevBuf<uint8_t> dev(pattern.size());
    REQUIRE(cudaMemcpy(dev.p, p, pattern.size(), cudaMemcpyDefault) == cudaSuccess);
    CHECK(dev.download(pattern.size()) == pattern);
    REQUIRE(cudaMemset(dev.p, 0x5a, pattern.size()) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, dev.p, pattern.size(), cudaMemcpyDefault) == cudaSuccess);
    CHECK(std::all_of(b, b + pattern.size(), [](uint8_t x) { return x == 0x5a; }));
    cuda::unpin_host(p, bytes);
    CHECK(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type != cudaMemoryTypeHost);
  }
  void* p = reinterpret_cast<void*>(1);
  CHECK(cuda::pin_host(0, &p) == cudaErrorInvalidValue);
  CHECK(p == nullptr);
}

}  // namespace
}  // namespace ssa::gputest
