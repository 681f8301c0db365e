// Tiered CUDA sessions (ssa_runtime_options.device_kv_budget) against the same
// sessions held wholly on the device: every method and dtype decodes bitwise
// equal (same selection, same arithmetic, only the bytes' tier differs); pages
// move both ways under appends, forks and truncates; snapshots round-trip
// through the tiers; injected pinned-allocation failures leave sessions
// unchanged; the stats count the rows read from the host and from the cache.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "cuda/pinned_pages.h"
#include "runtime.h"
#include "support/gpu_sessions.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

const ssa_method kMethods[] = {SSA_METHOD_DENSE,   SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK,
                               SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                               SSA_METHOD_SSA_ADAPTIVE};

struct Bytes {
  ssa_dtype t;
  uint32_t n;
  std::vector<uint8_t> k, v, q;
  size_t row() const { return size_t{kNkv} * kD * dtype_bytes(static_cast<DType>(t)); }
};

// Random keys with needles aligned to the queries (a heavy set exists), in dtype t.
Bytes make_bytes(uint32_t n, uint64_t seed, ssa_dtype t) {
  const DType dt = static_cast<DType>(t);
  const size_t e = dtype_bytes(dt);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Bytes b{t, n, {}, {}, {}};
  std::vector<float> q(kNq * kD);
  for (auto& x : q) x = nd(rng);
  b.q.resize(q.size() * e);
  for (size_t i = 0; i < q.size(); ++i) store_from_f32(b.q.data(), dt, i, q[i]);
  b.k.resize(size_t{n} * kNkv * kD * e);
  b.v.resize(b.k.size());
  for (uint32_t i = 0; i < n; ++i) {
    const bool needle = rng() % 48 == 0;
    for (uint32_t h = 0; h < kNkv; ++h)
      for (uint32_t j = 0; j < kD; ++j) {
        const size_t at = (size_t{i} * kNkv + h) * kD + j;
        store_from_f32(b.k.data(), dt, at, nd(rng) + (needle ? 2.0f * q[h * (kNq / kNkv) * kD + j] : 0.f));
        store_from_f32(b.v.data(), dt, at, nd(rng));
      }
  }
  return b;
}

ssa_runtime* tiered_runtime(uint64_t budget, uint64_t cache) {
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = budget;
  o.host_cache_bytes = cache;
  ssa_runtime* rt = nullptr;
  REQUIRE(ssa_runtime_create(&o, &rt) == SSA_OK);
  return rt;
}

void append(ssa_session* s, const Bytes& b, uint32_t from, uint32_t to) {
  const ssa_status st = ssa_session_append(s, 0, b.k.data() + from * b.row(), b.v.data() + from * b.row(), to - from);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
}

std::vector<uint8_t> out(ssa_session* s, const Bytes& b, const ssa_decode_params& p, ssa_decode_stats* st = nullptr) {
  std::vector<uint8_t> o(b.q.size(), 0xAB);
  const ssa_status r = ssa_decode(s, 0, b.q.data(), o.data(), &p, st);
  INFO(ssa_last_error_message());
  REQUIRE(r == SSA_OK);
  return o;
}

// Every method at budget 700, for steps 1..3.
std::vector<std::vector<uint8_t>> all_outputs(ssa_session* s, const Bytes& b) {
  std::vector<std::vector<uint8_t>> outs;
  for (uint64_t step = 1; step <= 3; ++step)
    for (ssa_method m : kMethods) outs.push_back(out(s, b, params(m, 700, step)));
  return outs;
}

std::string temp_path(const char* name) {
  return std::string(P_tmpdir) + "/ssa_gpu_tiers_" + std::to_string(getpid()) + "_" + name;
}

ssa_session* load(ssa_runtime* rt, const std::string& path) {
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_load(rt, path.c_str(), 0, &s);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return s;
}

// About a fifth of n tokens' K/V as the budget, 8 pages of it for the cache.
uint64_t budget_for(const Bytes& b, uint32_t n) { return 2 * b.row() * n / 5; }
uint64_t cache_for(const Bytes& b, uint64_t budget) { return std::min<uint64_t>(8 * 2 * b.row() * 128, budget / 2); }

TEST_CASE("gpu tiers: every method and dtype decodes bitwise equal to the untiered session") {
  SSA_GPU_TEST_OR_SKIP();
  for (ssa_dtype t : {SSA_DTYPE_F16, SSA_DTYPE_BF16, SSA_DTYPE_F32}) {
    INFO("dtype ", t);
    const Bytes b = make_bytes(12000, 100 + t, t);
    ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
    ssa_runtime* tiered = tiered_runtime(budget_for(b, b.n), cache_for(b, budget_for(b, b.n)));
    ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS, t);
    ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS, t);
    for (uint32_t a = 0; a < b.n; a += 3000) {  // each append moves pages between the tiers
      append(u, b, a, a + 3000);
      append(s, b, a, a + 3000);
    }
    {
      // The budget holds: the resident pages use part of it, never more.
      const DeviceBudget& budget = *tiered->budget;
      CHECK(budget.used(DeviceBudget::kResident) > 0);
      CHECK(budget.used(DeviceBudget::kResident) <= budget.limit(DeviceBudget::kResident));
    }
    for (uint64_t step = 1; step <= 4; ++step) {
      for (ssa_method m : kMethods) {
        INFO("method ", m, " step ", step);
        ssa_decode_stats su, ss;
        ssa_decode_stats_init(&su);
        ssa_decode_stats_init(&ss);
        const ssa_decode_params p = params(m, 700, step);
        CHECK(out(s, b, p, &ss) == out(u, b, p, &su));
        CHECK(ss.tokens_read == su.tokens_read);
        CHECK(su.rows_from_host == 0);
        CHECK(su.host_cache_hits == 0);
        CHECK(ss.rows_from_host > 0);  // most pages are on the host
        CHECK(ss.rows_from_host + ss.host_cache_hits <= ss.tokens_read);
        if (m == SSA_METHOD_DENSE) {
          // A dense read of every row: the host part is most of the context.
          CHECK(ss.rows_from_host + ss.host_cache_hits > ss.tokens_read / 2);
        }
      }
    }
    // The same sparse decode again and again: the pages its heavy rows lie in
    // come into the cache, and later decodes read them from there.
    uint64_t hits = 0;
    for (int i = 0; i < 4; ++i) {
      ssa_decode_stats ss;
      ssa_decode_stats_init(&ss);
      const ssa_decode_params p = params(SSA_METHOD_PQ_TOPK, 700, 9);
      CHECK(out(s, b, p) == out(u, b, p));
      out(s, b, p, &ss);
      hits = ss.host_cache_hits;
    }
    CHECK(hits > 0);
    CHECK(tiered->budget->used(DeviceBudget::kCache) > 0);
    CHECK(tiered->budget->used(DeviceBudget::kCache) <= tiered->budget->limit(DeviceBudget::kCache));
    ssa_session_destroy(s);
    // Every charge is given back once the session's memory is freed.
    CHECK(tiered->budget->used(DeviceBudget::kResident) == 0);
    CHECK(tiered->budget->used(DeviceBudget::kCache) == 0);
    ssa_session_destroy(u);
    ssa_runtime_destroy(tiered);
    ssa_runtime_destroy(flat);
  }
}

TEST_CASE("gpu tiers: appends, forks and truncates move pages both ways and change nothing else") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(16000, 7, SSA_DTYPE_F16);
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* tiered = tiered_runtime(budget_for(b, 8000), cache_for(b, budget_for(b, 8000)));
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  append(u, b, 0, 7000);
  append(s, b, 0, 7000);
  CHECK(all_outputs(s, b) == all_outputs(u, b));
  ssa_session *fu = nullptr, *fs = nullptr;
  REQUIRE(ssa_session_fork(u, &fu) == SSA_OK);
  REQUIRE(ssa_session_fork(s, &fs) == SSA_OK);
  append(u, b, 7000, 10000);
  append(s, b, 7000, 10000);
  append(fu, b, 12000, 14000);  // the forks grow apart from their sources
  append(fs, b, 12000, 14000);
  CHECK(all_outputs(s, b) == all_outputs(u, b));
  CHECK(all_outputs(fs, b) == all_outputs(fu, b));
  // Truncation brings old pages back into the window; later appends bring them back to the device.
  REQUIRE(ssa_session_truncate(u, 2500) == SSA_OK);
  REQUIRE(ssa_session_truncate(s, 2500) == SSA_OK);
  CHECK(all_outputs(s, b) == all_outputs(u, b));
  append(u, b, 10000, 16000);
  append(s, b, 10000, 16000);
  CHECK(all_outputs(s, b) == all_outputs(u, b));
  ssa_session_destroy(fs);
  // The source outlives its fork unchanged (the pages they shared become movable).
  append(u, b, 0, 300);
  append(s, b, 0, 300);
  CHECK(all_outputs(s, b) == all_outputs(u, b));
  ssa_session_destroy(fu);
  ssa_session_destroy(s);
  ssa_session_destroy(u);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu tiers: appends into cached host pages leave no stale copy behind") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(9000, 23, SSA_DTYPE_F16);
  const uint64_t page = 2 * b.row() * 128;
  // One resident page: the window lives on the host, and decodes cache its pages.
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* tiered = tiered_runtime(17 * page, 16 * page);
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  append(u, b, 0, 6000);
  append(s, b, 0, 6000);
  uint32_t n = 6000;
  uint64_t hits = 0;
  for (int round = 0; round < 8; ++round) {
    for (int i = 0; i < 3; ++i) {
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const ssa_decode_params p = params(SSA_METHOD_SSA, 700, 20 + i);
      CHECK(out(s, b, p, &st) == out(u, b, p));
      hits += st.host_cache_hits;
    }
    append(u, b, n, n + 37);  // into the last page, which decodes have cached
    append(s, b, n, n + 37);
    n += 37;
    INFO("round ", round);
    CHECK(all_outputs(s, b) == all_outputs(u, b));
  }
  CHECK(hits > 0);
  ssa_session_destroy(s);
  ssa_session_destroy(u);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

// The library allocates (and zeroes) device pages on the legacy default stream;
// the cache's copies into them run on the session's stream. With the legacy
// stream held up by a host function, a copy that did not wait for it would be
// zeroed after it was made, and later decodes would read the zeros.
void CUDART_CB hold_up(void*) { usleep(200 * 1000); }

TEST_CASE("gpu tiers: cache copies wait for their pages' allocation on the legacy default stream") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(6000, 29, SSA_DTYPE_F16);
  const uint64_t page = 2 * b.row() * 128;
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* tiered = tiered_runtime(17 * page, 16 * page);
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  append(u, b, 0, b.n);
  append(s, b, 0, b.n);
  uint64_t hits = 0;
  for (int i = 0; i < 6; ++i) {
    INFO("decode ", i);
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    const ssa_decode_params p = params(SSA_METHOD_SSA, 700, 40 + i % 2);
    const std::vector<uint8_t> ref = out(u, b, p);
    // Each decode admits the pages the one before read into the cache.
    REQUIRE(cudaLaunchHostFunc(nullptr, hold_up, nullptr) == cudaSuccess);
    CHECK(out(s, b, p, &st) == ref);
    hits += st.host_cache_hits;
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(hits > 0);  // the decodes read the copies
  for (int i = 0; i < 2; ++i) CHECK(all_outputs(s, b) == all_outputs(u, b));
  ssa_session_destroy(s);
  ssa_session_destroy(u);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu tiers: decode_batch over tiered sessions equals the untiered batch") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(9000, 3, SSA_DTYPE_BF16);
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* tiered = tiered_runtime(budget_for(b, 9000), cache_for(b, budget_for(b, 9000)));
  std::vector<ssa_session*> us, ts;
  for (uint32_t i = 0; i < 3; ++i) {
    us.push_back(session(flat, SSA_SESSION_HOST_POINTERS, SSA_DTYPE_BF16));
    ts.push_back(session(tiered, SSA_SESSION_HOST_POINTERS, SSA_DTYPE_BF16));
    append(us.back(), b, 0, 3000 + 2000 * i);
    append(ts.back(), b, 0, 3000 + 2000 * i);
  }
  for (ssa_method m : kMethods) {
    INFO("method ", m);
    std::vector<std::vector<uint8_t>> ou(3, std::vector<uint8_t>(b.q.size())), ot = ou;
    std::vector<ssa_decode_item> iu(3), it(3);
    for (uint32_t i = 0; i < 3; ++i) {
      iu[i] = ssa_decode_item{us[i], b.q.data(), ou[i].data()};
      it[i] = ssa_decode_item{ts[i], b.q.data(), ot[i].data()};
    }
    const ssa_decode_params p = params(m, 600, 5);
    REQUIRE(ssa_decode_batch(iu.data(), 3, 0, &p) == SSA_OK);
    REQUIRE(ssa_decode_batch(it.data(), 3, 0, &p) == SSA_OK);
    CHECK(ot == ou);
  }
  for (uint32_t i = 0; i < 3; ++i) {
    ssa_session_destroy(us[i]);
    ssa_session_destroy(ts[i]);
  }
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu tiers: snapshots round-trip through the tiers") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(10000, 11, SSA_DTYPE_F16);
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime* tiered = tiered_runtime(budget_for(b, b.n), cache_for(b, budget_for(b, b.n)));
  // A budget of three pages: a snapshot far bigger than it loads into the host tier.
  ssa_runtime* tiny = tiered_runtime(3 * 2 * b.row() * 128, 2 * b.row() * 128);
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  append(u, b, 0, b.n);
  append(s, b, 0, b.n);
  const auto ref = all_outputs(u, b);
  const std::string from_tiered = temp_path("t.ssa"), from_flat = temp_path("u.ssa");
  REQUIRE(ssa_session_save(s, from_tiered.c_str()) == SSA_OK);
  REQUIRE(ssa_session_save(u, from_flat.c_str()) == SSA_OK);
  for (ssa_runtime* rt : {flat, tiered, tiny}) {
    for (const std::string& path : {from_tiered, from_flat}) {
      ssa_session* l = load(rt, path);
      CHECK(all_outputs(l, b) == ref);
      // It keeps growing in its tiers.
      ssa_session* lu = load(flat, path);
      append(l, b, 0, 1500);
      append(lu, b, 0, 1500);
      CHECK(all_outputs(l, b) == all_outputs(lu, b));
      ssa_session_destroy(lu);
      ssa_session_destroy(l);
    }
  }
  // Checkpoints of a tiered session append to its file.
  append(s, b, 0, 700);
  append(u, b, 0, 700);
  REQUIRE(ssa_session_checkpoint(s, from_tiered.c_str()) == SSA_OK);
  ssa_session* l = load(flat, from_tiered);
  CHECK(all_outputs(l, b) == all_outputs(u, b));
  ssa_session_destroy(l);
  unlink(from_tiered.c_str());
  unlink(from_flat.c_str());
  ssa_session_destroy(s);
  ssa_session_destroy(u);
  ssa_runtime_destroy(tiny);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

ssa_session* load_mapped(ssa_runtime* rt, const std::string& path) {
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_load(rt, path.c_str(), SSA_LOAD_MMAP, &s);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return s;
}

// The third tier: K/V pages left in the snapshot file (SSA_LOAD_MMAP). Where the
// device cannot read pageable memory, every decode copies the rows its read sets
// take from the file into pinned pages between the selection and the attention
// (lib/cuda/file_staging.h); where it can, it reads them in place. Either way
// the output is the loaded session's, bit for bit.
TEST_CASE("gpu tiers: a snapshot mapped from its file decodes bitwise equal to the loaded session") {
  SSA_GPU_TEST_OR_SKIP();
  int pageable = 0;
  REQUIRE(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0) == cudaSuccess);
  MESSAGE(std::string(pageable ? "the device reads pageable memory: file pages are read in place"
                                : "the device cannot read pageable memory: file rows are staged"));
  for (ssa_dtype t : {SSA_DTYPE_F16, SSA_DTYPE_BF16, SSA_DTYPE_F32}) {
    INFO("dtype ", t);
    const Bytes b = make_bytes(9000, 300 + t, t);  // 9000 % 128 != 0: the last page is partly filled
    ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
    ssa_runtime* tiered = tiered_runtime(budget_for(b, b.n), cache_for(b, budget_for(b, b.n)));
    ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS, t);
    append(u, b, 0, b.n);
    const std::string path = temp_path("mapped.ssa");
    REQUIRE(ssa_session_save(u, path.c_str()) == SSA_OK);
    for (ssa_runtime* rt : {flat, tiered}) {
      ssa_session* m = load_mapped(rt, path);
      for (uint64_t step = 1; step <= 2; ++step) {
        for (ssa_method method : kMethods) {
          INFO("method ", method, " step ", step, rt == tiered ? " tiered" : " untiered");
          ssa_decode_stats sm, su;
          ssa_decode_stats_init(&sm);
          ssa_decode_stats_init(&su);
          const ssa_decode_params p = params(method, 700, step);
          CHECK(out(m, b, p, &sm) == out(u, b, p, &su));
          CHECK(sm.tokens_read == su.tokens_read);
          CHECK(sm.rows_from_host > 0);  // the file's pages are read
          CHECK(sm.rows_from_host + sm.host_cache_hits <= sm.tokens_read);
        }
      }
      // A batch of mapped and device sessions in one launch set.
      ssa_session* m2 = load_mapped(rt, path);
      std::vector<std::vector<uint8_t>> om(2, std::vector<uint8_t>(b.q.size())), ou = om;
      for (ssa_method method : {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_ORACLE_TOPK}) {
        INFO("batch, method ", method);
        ssa_decode_item im[2] = {{m, b.q.data(), om[0].data()}, {m2, b.q.data(), om[1].data()}};
        ssa_decode_item iu[2] = {{u, b.q.data(), ou[0].data()}, {u, b.q.data(), ou[1].data()}};
        const ssa_decode_params p = params(method, 600, 7);
        REQUIRE(ssa_decode_batch(im, 2, 0, &p) == SSA_OK);
        REQUIRE(ssa_decode_batch(iu, 2, 0, &p) == SSA_OK);
        CHECK(om == ou);
      }
      ssa_session_destroy(m2);
      // It grows (the mapped last page is copied before it is written), and a
      // save copies the mapped pages into another file that loads as the source.
      ssa_session* v = load(flat, path);
      append(m, b, 0, 1000);
      append(v, b, 0, 1000);
      CHECK(all_outputs(m, b) == all_outputs(v, b));
      // Retraining reads every key, the mapped ones too.
      REQUIRE(ssa_session_update_index(m) == SSA_OK);
      REQUIRE(ssa_session_update_index(v) == SSA_OK);
      CHECK(all_outputs(m, b) == all_outputs(v, b));
      const std::string copy = temp_path("mapped_copy.ssa");
      REQUIRE(ssa_session_save(m, copy.c_str()) == SSA_OK);
      ssa_session* c = load(flat, copy);
      CHECK(all_outputs(c, b) == all_outputs(v, b));
      ssa_session_destroy(c);
      unlink(copy.c_str());
      ssa_session_destroy(v);
      ssa_session_destroy(m);
    }
    unlink(path.c_str());
    ssa_session_destroy(u);
    ssa_runtime_destroy(tiered);
    ssa_runtime_destroy(flat);
  }
}

// A staged decode of a mapped session takes pinned pages for the rows it copies:
// when none can be had it fails with SSA_ERR_OUT_OF_MEMORY, writes nothing to
// out, and the next decode is the loaded session's again.
TEST_CASE("gpu tiers: a staged decode of a mapped session without pinned memory fails and changes nothing") {
  SSA_GPU_TEST_OR_SKIP();
  int pageable = 0;
  REQUIRE(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0) == cudaSuccess);
  if (pageable) {
    MESSAGE("the device reads the mapping in place: nothing is staged");
    return;
  }
  const Bytes b = make_bytes(6000, 41, SSA_DTYPE_F16);
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  append(u, b, 0, b.n);
  const std::string path = temp_path("staged_oom.ssa");
  REQUIRE(ssa_session_save(u, path.c_str()) == SSA_OK);
  ssa_session* m = load_mapped(flat, path);
  for (ssa_method method : {SSA_METHOD_SSA, SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK}) {
    INFO("method ", method);
    const ssa_decode_params p = params(method, 700, 3);
    cuda::set_pinned_alloc_failure_countdown(1, true);
    std::vector<uint8_t> o(b.q.size(), 0xAB);
    const ssa_status st = ssa_decode(m, 0, b.q.data(), o.data(), &p, nullptr);
    cuda::set_pinned_alloc_failure_countdown(0, false);
    CHECK(st == SSA_ERR_OUT_OF_MEMORY);
    CHECK(std::string(ssa_last_error_message()).find("pinned") != std::string::npos);
    CHECK(std::all_of(o.begin(), o.end(), [](uint8_t x) { return x == 0xAB; }));
    CHECK(ssa_session_length(m) == b.n);
    CHECK(out(m, b, p) == out(u, b, p));
  }
  ssa_session_destroy(m);
  unlink(path.c_str());
  ssa_session_destroy(u);
  ssa_runtime_destroy(flat);
}

TEST_CASE("gpu tiers: pinned host memory exhaustion at every point leaves the session unchanged") {
  SSA_GPU_TEST_OR_SKIP();
  const Bytes b = make_bytes(9000, 19, SSA_DTYPE_F16);
  ssa_runtime* tiered = tiered_runtime(budget_for(b, 4000), cache_for(b, budget_for(b, 4000)));
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  append(s, b, 0, 5000);
  const auto ref = all_outputs(s, b);
  int failures = 0;
  for (uint64_t n = 1; n < 1000; ++n) {
    cuda::set_pinned_alloc_failure_countdown(n, true);
    const ssa_status st = ssa_session_append(s, 0, b.k.data() + 5000 * b.row(), b.v.data() + 5000 * b.row(), 4000);
    cuda::set_pinned_alloc_failure_countdown(0, false);
    if (st == SSA_OK) break;
    INFO("pinned allocation ", n, ": ", ssa_last_error_message());
    REQUIRE(st == SSA_ERR_OUT_OF_MEMORY);
    ++failures;
    CHECK(ssa_session_length(s) == 5000);
    CHECK(all_outputs(s, b) == ref);
  }
  CHECK(failures > 0);  // the append needed host pages
  CHECK(ssa_session_length(s) == 9000);
  // A load that runs out of pinned memory returns no session.
  const std::string path = temp_path("oom.ssa");
  REQUIRE(ssa_session_save(s, path.c_str()) == SSA_OK);
  cuda::set_pinned_alloc_failure_countdown(2, true);
  ssa_session* l = nullptr;
  CHECK(ssa_session_load(tiered, path.c_str(), 0, &l) == SSA_ERR_OUT_OF_MEMORY);
  cuda::set_pinned_alloc_failure_countdown(0, false);
  CHECK(l == nullptr);
  unlink(path.c_str());
  ssa_session_destroy(s);
  ssa_runtime_destroy(tiered);
}

}  // namespace
}  // namespace ssa::gputest
