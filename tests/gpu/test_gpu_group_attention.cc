// The attention of grouped decodes (group selection with G >= 2 q heads per KV
// head), which reads each row of a KV group's read set once for all of its q
// heads (kernels/group_attention.cu on tensor cores; the CUDA-core split kernel
// for f32, head dims 32 and 512 and groups above 16): every q head's output
// against the float64 Horvitz-Thompson estimator over its group's rows and log pi
// as the selection stages left them, for f16, bf16 and f32, every head dim, odd
// groups and two head tiles, 16-token pages with a partial last page, 1 to 250
// splits, no samples, no candidates selected, and a dense item in the batch;
// against the per-head kernel on the same selection; with pages in mapped host
// memory bitwise as with device pages; and the tier accounting's rows per page
// and per tier equal to the rows every q head's read set holds (what the
// per-head kernel reads), also through the C API on tiered sessions.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "decode/decode_plan.h"
#include "kernels/stages.h"
#include "kernels/tier_accounting.h"
#include "lib/cuda/method_plan.h"
#include "support/gpu_layer.h"
#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

using cuda::DecodeBatch;
using cuda::RowState;

const char* dtype_name(DType dt) { return dt == DType::kF16 ? "f16" : dt == DType::kBF16 ? "bf16" : "f32"; }

// Output rounding to the dtype and, for the 2-byte types, the weights rounded to
// the dtype for the tensor-core products (as the dense kernel).
double tolerance(DType dt) { return dt == DType::kF16 ? 2e-3 : dt == DType::kBF16 ? 8e-3 : 2e-5; }

struct GroupDecode {
  DecodeBatch b;
  Decoder dec;
  DevBuf<uint8_t> out;
  ssa_decode_params p;
  DecodePlan plan;
};

// One grouped decode of layer t planned as the CUDA backend plans it
// (lib/cuda/launch_set.cc); `table` replaces the layer's page table when set.
void setup(GroupDecode& r, const TestLayer& t, ssa_method method, uint32_t group, uint32_t budget, uint32_t sink,
           uint32_t local, uint64_t step, const uint8_t* const* table = nullptr) {
  ssa_decode_params_init(&r.p);
  r.p.method = method;
  r.p.budget = budget;
  r.p.heavy_fraction = 0.4f;
  r.p.n_sink = sink;
  r.p.n_local = local;
  r.p.step = step;
  r.p.seed = 77;
  r.p.group_selection = group;
  r.plan = plan_decode(t.n, r.p);
  const uint32_t G = t.L.group_size();
  r.b = DecodeBatch{};
  r.b.shape = shape_of(t.L);
  r.b.n_items = 1;
  const char* why = cuda::unsupported_shape(r.b.shape, true);
  REQUIRE_MESSAGE(why == nullptr, why);
  const bool dense = r.plan.dense || cuda::group_reads_all(r.plan, r.p, G);
  REQUIRE_MESSAGE(!dense, "the test wants a sparse decode");
  cuda::set_method(method, &r.b);
  cuda::set_group(r.p, G, &r.b);
  r.b.pi_min = r.p.pi_min;
  r.b.seed = r.p.seed;
  r.b.step = step;
  r.b.layer = 1;
  const size_t out_bytes = size_t{t.L.n_q_heads} * t.L.row_bytes();
  if (r.out.n < out_bytes) r.out = DevBuf<uint8_t>(out_bytes);
  CUDA_OK(cudaMemset(r.out.p, 0xff, out_bytes));  // poison: NaN in every dtype
  r.b.items[0] = item_of(t, r.out.p);
  if (table) r.b.items[0].kv_pages = table;
  cuda::plan_item(r.plan, r.p, G, &r.b.items[0]);
}

std::vector<uint8_t> run_raw(GroupDecode& r, const TestLayer& t) {
  CUDA_OK(r.dec.run(&r.b));
  CUDA_OK(cudaDeviceSynchronize());
  return r.out.download(size_t{t.L.n_q_heads} * t.L.row_bytes());
}

// The read set of selection row `sh` of item `i` (sink, local, heavy, samples)
// and each position's log pi, as the workspace holds it after the decode.
struct ReadRows {
  std::vector<uint32_t> toks;
  std::vector<double> log_pi;
  uint32_t n_heavy = 0, n_sampled = 0;
};

ReadRows read_rows(const Decoder& dec, const DecodeBatch& b, uint32_t i, uint32_t sh) {
  const cuda::DecodeItem& it = b.items[i];
  ReadRows r;
  if (it.sink_end >= it.local_begin) {  // dense item: every token
    for (uint32_t x = 0; x < it.n_tokens; ++x) r.toks.push_back(x), r.log_pi.push_back(0);
    return r;
  }
  RowState st;
  CUDA_OK(cudaMemcpy(&st, dec.ws.rows + size_t{i} * b.sel_heads() + sh, sizeof st, cudaMemcpyDeviceToHost));
  REQUIRE(st.n_heavy <= it.select_cap);
  REQUIRE(st.n_unique <= it.select_cap);
  const size_t sel = it.select_base + size_t{sh} * it.select_cap;
  std::vector<uint32_t> heavy(st.n_heavy), sampled(st.n_unique);
  std::vector<float> lp(st.n_unique);
  if (st.n_heavy) CUDA_OK(cudaMemcpy(heavy.data(), dec.ws.heavy + sel, st.n_heavy * 4, cudaMemcpyDeviceToHost));
  if (st.n_unique) {
    CUDA_OK(cudaMemcpy(sampled.data(), dec.ws.uniq_sorted + sel, st.n_unique * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lp.data(), dec.ws.log_pi + sel, st.n_unique * 4, cudaMemcpyDeviceToHost));
  }
  for (uint32_t x = 0; x < it.sink_end; ++x) r.toks.push_back(x), r.log_pi.push_back(0);
  for (uint32_t x = it.local_begin; x < it.n_tokens; ++x) r.toks.push_back(x), r.log_pi.push_back(0);
  for (uint32_t x : heavy) r.toks.push_back(x), r.log_pi.push_back(0);
  for (size_t s = 0; s < sampled.size(); ++s) r.toks.push_back(sampled[s]), r.log_pi.push_back(lp[s]);
  r.n_heavy = st.n_heavy;
  r.n_sampled = st.n_unique;
  return r;
}

// Largest relative error over the q heads of item i against the float64 estimator
// over their group's rows (out: the item's decoded output).
double worst_err(const Decoder& dec, const DecodeBatch& b, uint32_t i, const TestLayer& t,
                 const std::vector<float>& got, size_t out_off) {
  const uint32_t G = t.L.group_size(), d = t.L.head_dim;
  double worst = 0;
  for (uint32_t kvh = 0; kvh < t.L.n_kv_heads; ++kvh) {
    const ReadRows rows = read_rows(dec, b, i, b.grouped() ? kvh : kvh * G);
    for (uint32_t g = 0; g < G; ++g) {
      const uint32_t h = kvh * G + g;
      worst = std::max(worst, rel_err(got, attend_ref(t, h, rows.toks, rows.log_pi), out_off + size_t{h} * d));
    }
  }
  return worst;
}

// The per-head attention (the kernels group selection used before: one q head per
// block over its group's read set) on the decode's own selection, into `out`.
std::vector<float> per_head_output(const GroupDecode& r, const TestLayer& t, DevBuf<uint8_t>& out) {
  DecodeBatch b = r.b;
  b.items[0].out = out.p;
  CUDA_OK(cudaMemset(out.p, 0xff, out.n));
  CUDA_OK(cuda::sparse_gather_supported(b.shape) ? cuda::launch_sparse_gather(b, r.dec.plan, r.dec.ws, nullptr)
                                                  : cuda::launch_sparse_split(b, r.dec.plan, r.dec.ws, nullptr));
  CUDA_OK(cuda::launch_merge_splits(b, r.dec.plan, r.dec.ws, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const size_t count = size_t{t.L.n_q_heads} * t.L.head_dim;
  return decode_out(t.L.dtype, out.download(count * t.L.elem_bytes()), count);
}

struct Shape {
  uint32_t nq, nkv, d;
  DType dt;
};

TEST_CASE("gpu group attention: every q head's estimator over its group's rows matches float64") {
  SSA_GPU_TEST_OR_SKIP();
  // Tensor cores: G 2, 3 (heads past G in the tile), 4, 16 (two head tiles) in
  // both 2-byte types and every head dim they serve; CUDA cores: f32 (G 3: one
  // head per block, 4, 8), head dims 32 and 512, and G 24 (> 16) in f16.
  const Shape shapes[] = {
      {4, 2, 64, DType::kF16},   {6, 2, 128, DType::kBF16}, {8, 2, 256, DType::kF16},  {8, 2, 128, DType::kBF16},
      {32, 2, 128, DType::kF16}, {32, 2, 64, DType::kBF16}, {16, 1, 256, DType::kBF16}, {6, 2, 64, DType::kF32},
      {8, 2, 128, DType::kF32},  {16, 2, 256, DType::kF32}, {8, 2, 32, DType::kF16},   {8, 1, 512, DType::kBF16},
      {24, 1, 128, DType::kF16},
  };
  for (const Shape& sh : shapes) {
    TestLayer t;
    // 7001 tokens in 16-token pages: a partial last page, rows of a stage spread
    // over many pages.
    build_layer(t, sh.nq, sh.nkv, sh.d, sh.dt, 7001, 16, 16, 64, 31 * sh.nq + sh.d + uint32_t(sh.dt));
    const uint32_t G = t.L.group_size();
    for (uint32_t splits : {0u, 1u, 250u}) {
      for (uint32_t group : {SSA_GROUP_MIXTURE, SSA_GROUP_MEAN_QUERY}) {
        GroupDecode r;
        setup(r, t, SSA_METHOD_SSA, group, 300, 64, 64, 3);
        r.b.n_splits = splits;
        REQUIRE(cuda::group_attention(r.b));
        const auto raw = run_raw(r, t);
        const size_t count = size_t{t.L.n_q_heads} * t.L.head_dim;
        const auto got = decode_out(t.L.dtype, raw, count);
        const ReadRows rows = read_rows(r.dec, r.b, 0, 0);
        const double e = worst_err(r.dec, r.b, 0, t, got, 0);
        INFO(dtype_name(sh.dt), " d ", sh.d, " G ", G, " splits ", r.dec.plan.n_splits, " proposal ", group,
             " |H| ", rows.n_heavy, " |S| ", rows.n_sampled, " worst rel err ", e);
        CHECK(rows.n_sampled > 0);
        CHECK(e <= tolerance(sh.dt));
        // The per-head kernel on the same rows: the same estimator, to rounding.
        DevBuf<uint8_t> other(r.out.n);
        const auto per_head = per_head_output(r, t, other);
        const double diff = ssa_test::rel_l2(got.data(), per_head.data(), per_head.size());
        INFO("relative difference to the per-head kernel ", diff);
        CHECK(diff <= 2 * tolerance(sh.dt));
      }
    }
  }
}

TEST_CASE("gpu group attention: every method, no samples, nothing selected, and a dense item in the batch") {
  SSA_GPU_TEST_OR_SKIP();
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    TestLayer t[3];
    const uint32_t lens[3] = {9000, 2000, 5003};
    for (int i = 0; i < 3; ++i) build_layer(t[i], 8, 2, 128, dt, lens[i], 16, 16, 64, 500 + 10 * i + uint32_t(dt));
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                         SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      // One item alone.
      {
        GroupDecode r;
        setup(r, t[0], m, SSA_GROUP_MIXTURE, 450, 100, 64, 5);
        const size_t count = size_t{8} * 128;
        const auto got = decode_out(dt, run_raw(r, t[0]), count);
        const ReadRows rows = read_rows(r.dec, r.b, 0, 1);
        INFO(dtype_name(dt), " method ", m, " |H| ", rows.n_heavy, " |S| ", rows.n_sampled);
        if (m == SSA_METHOD_PQ_TOPK || m == SSA_METHOD_ORACLE_TOPK) CHECK(rows.n_sampled == 0);
        CHECK(worst_err(r.dec, r.b, 0, t[0], got, 0) <= tolerance(dt));
      }
      // Three items in one launch set: sparse, dense, and sparse with nothing
      // selected (sink and local only).
      GroupDecode r;
      setup(r, t[0], m, SSA_GROUP_MEAN_QUERY, 450, 100, 64, 6);
      const size_t item_bytes = size_t{8} * t[0].L.row_bytes();
      DevBuf<uint8_t> out(3 * item_bytes);
      CUDA_OK(cudaMemset(out.p, 0xff, out.n));
      r.b.n_items = 3;
      for (uint32_t i = 0; i < 3; ++i) {
        r.b.items[i] = item_of(t[i], out.p + i * item_bytes);
        cuda::plan_item(plan_decode(lens[i], r.p), r.p, 4, &r.b.items[i]);
      }
      r.b.items[1].sink_end = r.b.items[1].local_begin = lens[1];
      r.b.items[1].n_select = r.b.items[1].n_heavy = 0;
      r.b.items[2].n_select = r.b.items[2].n_heavy = 0;
      CUDA_OK(r.dec.run(&r.b));
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = decode_out(dt, out.download(out.n), 3 * 8 * 128);
      for (uint32_t i = 0; i < 3; ++i) {
        INFO(dtype_name(dt), " method ", m, " item ", i);
        if (i == 2) CHECK(read_rows(r.dec, r.b, 2, 0).toks.size() == 100 + 64);
        CHECK(worst_err(r.dec, r.b, i, t[i], got, size_t{i} * 8 * 128) <= tolerance(dt));
      }
    }
  }
}

// A page table where every third page (and the last, partial one) lives in mapped
// pinned host memory, as a tiered session's host pages do.
struct HostPages {
  std::vector<void*> host;
  DevBuf<const uint8_t*> table;
  std::vector<uint8_t> tier;  // cuda::TierCode per page: host pages kTierHost, a few kTierCached
  explicit HostPages(const TestLayer& t) {
    const size_t pages = t.kv_pages.size(), bytes = t.L.kv_page_bytes();
    std::vector<const uint8_t*> ptrs(t.kv_pages.begin(), t.kv_pages.end());
    tier.assign(pages, cuda::kTierDevice);
    for (size_t pg = 0; pg < pages; ++pg) {
      if (pg % 3 != 0 && pg + 1 != pages) {
        if (pg % 7 == 1) tier[pg] = cuda::kTierCached;  // a device copy of a host page
        continue;
      }
      void* h = nullptr;
      CUDA_OK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
      CUDA_OK(cudaMemcpy(h, t.kv_pages[pg], bytes, cudaMemcpyDeviceToHost));
      void* dp = nullptr;
      CUDA_OK(cudaHostGetDevicePointer(&dp, h, 0));
      host.push_back(h);
      ptrs[pg] = static_cast<const uint8_t*>(dp);
      tier[pg] = cuda::kTierHost;
    }
    table = DevBuf<const uint8_t*>(pages);
    table.upload(ptrs);
  }
  ~HostPages() {
    for (void* h : host) cudaFreeHost(h);
  }
};

TEST_CASE("gpu group attention: host pages decode bitwise as device pages, and the tier counts are every head's rows") {
  SSA_GPU_TEST_OR_SKIP();
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    TestLayer t;
    build_layer(t, 8, 2, 128, dt, 12001, 16, 16, 64, 4000 + uint32_t(dt));
    HostPages hp(t);
    const uint32_t G = t.L.group_size(), pages = static_cast<uint32_t>(hp.tier.size());
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
      GroupDecode flat, tiered;
      setup(flat, t, m, SSA_GROUP_MIXTURE, 600, 64, 64, 8);
      setup(tiered, t, m, SSA_GROUP_MIXTURE, 600, 64, 64, 8, hp.table.p);
      INFO(dtype_name(dt), " method ", m);
      const auto want = run_raw(flat, t);
      const auto got = run_raw(tiered, t);
      CHECK(got == want);
      const size_t count = size_t{t.L.n_q_heads} * t.L.head_dim;
      CHECK(worst_err(tiered.dec, tiered.b, 0, t, decode_out(dt, got, count), 0) <= tolerance(dt));

      // Tier accounting after the decode, on its workspace.
      DevBuf<uint8_t> tier_dev(pages);
      tier_dev.upload(hp.tier);
      DevBuf<uint32_t> page_rows(pages);
      DevBuf<unsigned long long> counts(2);
      CUDA_OK(cudaMemset(page_rows.p, 0, pages * 4));
      CUDA_OK(cudaMemset(counts.p, 0, 16));
      cuda::TierBatch tb{};
      tb.items[0] = cuda::TierItem{tier_dev.p, page_rows.p, counts.p};
      CUDA_OK(cuda::launch_tier_accounting(tiered.b, tiered.dec.ws, tb, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      // Reference: every q head reads all of its group's rows, as the per-head
      // kernel did, so each row of a KV head's read set counts G times.
      std::vector<uint32_t> want_rows(pages, 0);
      uint64_t want_host = 0, want_cached = 0;
      for (uint32_t kvh = 0; kvh < t.L.n_kv_heads; ++kvh) {
        const ReadRows rows = read_rows(tiered.dec, tiered.b, 0, kvh);
        for (uint32_t tok : rows.toks) {
          const uint32_t pg = tok / t.L.page_tokens;
          want_rows[pg] += G;
          want_host += hp.tier[pg] == cuda::kTierHost ? G : 0;
          want_cached += hp.tier[pg] == cuda::kTierCached ? G : 0;
        }
      }
      const auto got_counts = counts.download(2);
      CHECK(page_rows.download(pages) == want_rows);
      CHECK(got_counts[0] == want_host);
      CHECK(got_counts[1] == want_cached);
      CHECK(want_host > 0);
      CHECK(want_cached > 0);
    }
  }
}

TEST_CASE("gpu group attention: tiered sessions decode bitwise as untiered ones and count their host rows") {
  SSA_GPU_TEST_OR_SKIP();
  const Data d = make_data(12000, 909);
  const uint64_t row = uint64_t{kNkv} * kD * 2;
  ssa_runtime* flat = runtime(SSA_BACKEND_CUDA);
  ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  o.device_kv_budget = 2 * row * d.n / 5;  // about a fifth of the K/V on the device
  o.host_cache_bytes = std::min<uint64_t>(8 * 2 * row * 128, o.device_kv_budget / 2);
  ssa_runtime* tiered = nullptr;
  REQUIRE(ssa_runtime_create(&o, &tiered) == SSA_OK);
  ssa_session* u = session(flat, SSA_SESSION_HOST_POINTERS);
  ssa_session* s = session(tiered, SSA_SESSION_HOST_POINTERS);
  fill(u, d, false);
  fill(s, d, false);
  for (uint32_t group : {SSA_GROUP_MEAN_QUERY, SSA_GROUP_MIXTURE}) {
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                         SSA_METHOD_SSA_ADAPTIVE}) {
      for (uint64_t step = 1; step <= 2; ++step) {
        ssa_decode_params p = params(m, 700, step);
        p.group_selection = group;
        ssa_decode_stats su, ss;
        ssa_decode_stats_init(&su);
        ssa_decode_stats_init(&ss);
        INFO("proposal ", group, " method ", m, " step ", step);
        CHECK(decode(s, d, p, false, &ss) == decode(u, d, p, false, &su));
        CHECK(ss.tokens_read == su.tokens_read);
        CHECK(su.rows_from_host == 0);
        CHECK(su.host_cache_hits == 0);
        CHECK(ss.rows_from_host > 0);
        CHECK(ss.rows_from_host + ss.host_cache_hits <= ss.tokens_read);
      }
    }
  }
  // The same grouped decode again and again: its rows' pages come into the
  // cache, and later decodes read them from there.
  ssa_decode_params p = params(SSA_METHOD_PQ_TOPK, 700, 9);
  p.group_selection = SSA_GROUP_MIXTURE;
  uint64_t hits = 0;
  for (int i = 0; i < 4; ++i) {
    ssa_decode_stats ss;
    ssa_decode_stats_init(&ss);
    CHECK(decode(s, d, p, false, &ss) == decode(u, d, p, false));
    hits = ss.host_cache_hits;
  }
  CHECK(hits > 0);
  ssa_session_destroy(s);
  ssa_session_destroy(u);
  ssa_runtime_destroy(tiered);
  ssa_runtime_destroy(flat);
}

}  // namespace
}  // namespace ssa::gputest
