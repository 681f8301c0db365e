// Sharded sessions on the CPU backend (docs/SHARDING.md): a runtime over 2-4
// in-process shards decodes every method, group_selection mode and dtype
// bitwise as an unsharded runtime does, on structured random contexts whose
// shards are uneven and whose boundaries fall inside appends, sink or local
// windows; after forks, truncations (which drop whole shards), appends that
// cross shard boundaries, and snapshots saved on one shard count and loaded on
// another. The global top-k of the shards and the split residual sampler are
// also checked directly against their unsharded counterparts, and bad sharding
// options give clear errors.
#include <doctest/doctest.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "decode/decode.h"
#include "select/fixed_point_sampler.h"
#include "select/radix_topk.h"
#include "shard/in_process_collective.h"
#include "shard/shard_map.h"
#include "shard/sharded_topk.h"
#include "status.h"
#include "support/reference_attention.h"
#include "support/session_helpers.h"
#include "support/structured_feed.h"

using namespace ssa_test;

namespace {

constexpr uint64_t kShard = 8192;  // the smallest shard budget (one decode split)
constexpr ssa_dtype kDtypes[] = {SSA_DTYPE_F32, SSA_DTYPE_F16, SSA_DTYPE_BF16};
constexpr uint32_t kGroupModes[] = {SSA_GROUP_OFF, SSA_GROUP_MIXTURE, SSA_GROUP_MEAN_QUERY};

RuntimePtr sharded_runtime(uint32_t n_shards, uint64_t shard_tokens, int threads = 2) {
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, threads);
  o.seed = 1234;
  // Any distinct ordinals name the in-process shards; not in order on purpose.
  std::vector<int32_t> devices;
  for (uint32_t i = 0; i < n_shards; ++i) devices.push_back(static_cast<int32_t>((i * 5 + 3) % 11 + 11 * (i / 11)));
  o.devices = devices.data();
  o.n_devices = n_shards;
  o.shard_tokens = shard_tokens;
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  REQUIRE(ssa_runtime_num_shards(rt) == n_shards);
  return RuntimePtr(rt);
}

// Two layers: layer 1 is filled to other lengths than layer 0.
ssa_session_config shard_config(ssa_dtype t) { return quick_index_config(2, t); }

struct Outcome {
  std::vector<uint8_t> out;
  ssa_decode_stats stats;
};

Outcome decode_raw(ssa_session* s, uint32_t layer, const std::vector<uint8_t>& q, const ssa_decode_params& p) {
  Outcome o;
  o.out.assign(q.size(), 0xAB);
  ssa_decode_stats_init(&o.stats);
  SSA_CHECK_OK(ssa_decode(s, layer, q.data(), o.out.data(), &p, &o.stats));
  return o;
}

// Decode parameter sets that cover every method and group mode, sink and local
// windows of several sizes (a local window of 700 crosses a shard boundary when
// the last shard holds fewer tokens), budgets by sparsity and by count, a
// window-only budget, and a budget >= N.
std::vector<ssa_decode_params> param_grid() {
  std::vector<ssa_decode_params> grid;
  for (ssa_method m : kAllMethods) {
    for (uint32_t mode : kGroupModes) {
      if (m == SSA_METHOD_DENSE && mode != SSA_GROUP_OFF) continue;
      ssa_decode_params p = params(m, 0, 20.0f);
      p.group_selection = mode;
      p.step = 11;
      grid.push_back(p);
      p.n_sink = 16;
      p.n_local = 700;
      p.sparsity = 40.0f;
      p.heavy_fraction = 0.25f;
      p.step = 12;
      grid.push_back(p);
    }
  }
  ssa_decode_params w = params(SSA_METHOD_SSA, 200);  // sink + local only
  grid.push_back(w);
  w.group_selection = SSA_GROUP_MIXTURE;
  grid.push_back(w);
  ssa_decode_params all = params(SSA_METHOD_SSA_ADAPTIVE, 4000000);  // >= N: dense
  grid.push_back(all);
  return grid;
}

// Every parameter set on every layer: bitwise the same output and statistics.
void check_same_decodes(ssa_session* ref, ssa_session* sharded, const StructuredFeed& f, const char* what) {
  CAPTURE(what);
  const std::vector<uint8_t>& q = f.q;
  size_t compared = 0;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    REQUIRE(ssa_session_layer_length(ref, layer) == ssa_session_layer_length(sharded, layer));
    if (ssa_session_layer_length(ref, layer) == 0) continue;
    for (const ssa_decode_params& p : param_grid()) {
      CAPTURE(layer);
      CAPTURE(p.method);
      CAPTURE(p.group_selection);
      CAPTURE(p.n_local);
      const Outcome a = decode_raw(ref, layer, q, p), b = decode_raw(sharded, layer, q, p);
      CHECK(a.out == b.out);
      CHECK(same_stats(a.stats, b.stats));
      ++compared;
    }
  }
  CHECK(compared > 0);
}

std::string temp_path(const char* name) {
  return std::string("/tmp/ssa_sharding_") + std::to_string(getpid()) + "_" + name + ".ssa";
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("sharding: the shard map fills shards in order, the last takes the rest") {
  auto r = ssa::shard_ranges(30000, 4, kShard);
  REQUIRE(r.size() == 4);
  CHECK(r[0].begin == 0);
  CHECK(r[0].end == 8192);
  CHECK(r[1].end == 16384);
  CHECK(r[2].end == 24576);
  CHECK(r[3].begin == 24576);
  CHECK(r[3].end == 30000);
  r = ssa::shard_ranges(10000, 4, kShard);
  CHECK(r[1].size() == 10000 - 8192);
  CHECK(r[2].size() == 0);
  CHECK(r[3].size() == 0);
  r = ssa::shard_ranges(100000, 2, kShard);
  CHECK(r[1].size() == 100000 - 8192);  // no device left: the last shard grows
}

TEST_CASE("sharding: the shard map never overflows: any shard_tokens up to 2^64 - 8192, 1 to 64 shards") {
  // Shard i starts at min(n, i * B), computed here in 128 bits; ranges cover [0, n) in order.
  std::mt19937_64 rng(2026);
  const uint64_t top = ~uint64_t{0} - (kShard - 1);  // 2^64 - 8192, the largest multiple of 8192
  const uint64_t edges[] = {kShard, 2 * kShard, uint64_t{1} << 32, uint64_t{1} << 59, uint64_t{1} << 62,
                            uint64_t{1} << 63, (uint64_t{1} << 63) + kShard, top - kShard, top};
  const uint64_t lengths[] = {0, 1, kShard - 1, kShard, kShard + 1, 3 * kShard + 5, 0xFFFFFFFFull};
  auto check = [](uint64_t n, uint32_t shards, uint64_t b) {
    INFO("n ", n, " shards ", shards, " shard_tokens ", b);
    const auto r = ssa::shard_ranges(n, shards, b);
    REQUIRE(r.size() == shards);
    uint64_t at = 0;
    for (uint32_t i = 0; i < shards; ++i) {
      const unsigned __int128 start = static_cast<unsigned __int128>(i) * b;
      const uint64_t want_begin = start < n ? static_cast<uint64_t>(start) : n;
      const unsigned __int128 stop = static_cast<unsigned __int128>(i + 1) * b;
      const uint64_t want_end = i + 1 == shards ? n : (stop < n ? static_cast<uint64_t>(stop) : n);
      CHECK(r[i].begin == want_begin);
      CHECK(r[i].end == want_end);
      CHECK(r[i].begin == at);
      CHECK(r[i].end >= r[i].begin);
      at = r[i].end;
    }
    CHECK(at == n);
    const uint64_t sink_end = std::min<uint64_t>(n, 128);
    const auto c = ssa::chunk_aligned_ranges(n, shards, b, sink_end, 1024);
    REQUIRE(c.size() == shards);
    uint64_t covered = 0;
    for (const auto& x : c) {
      if (x.size() == 0) continue;
      CHECK(x.begin == covered);
      covered = x.end;
    }
    CHECK(covered == n);
  };
  for (uint64_t b : edges)
    for (uint64_t n : lengths)
      for (uint32_t shards : {1u, 2u, 3u, 5u, 63u, 64u}) check(n, shards, b);
  for (int iter = 0; iter < 4000; ++iter) {
    // Multiples of 8192 spread over every magnitude up to 2^64 - 8192.
    const int bits = 13 + static_cast<int>(rng() % 52);
    const uint64_t b = std::max<uint64_t>(kShard, (rng() >> (64 - bits)) & ~(kShard - 1));
    const uint64_t n = iter % 3 == 0 ? rng() % 0x100000000ull : rng() % (4 * kShard);
    check(n, 1 + static_cast<uint32_t>(rng() % 64), b);
  }
}

TEST_CASE("sharding: huge shard_tokens decode as unsharded (every token in the first shard)") {
  auto ref_rt = make_runtime(2);
  const ssa_dtype t = SSA_DTYPE_F16;
  const StructuredFeed f(kShard + 700, t, 9);
  auto ref = make_session(ref_rt.get(), shard_config(t));
  f.append({ref.get()}, 0, 0, f.ctx.n);
  const struct {
    uint32_t shards;
    uint64_t b;
  } cases[] = {{3, uint64_t{1} << 63}, {5, uint64_t{1} << 62}, {64, uint64_t{1} << 59},
               {2, ~uint64_t{0} - (kShard - 1)}};
  for (const auto& c : cases) {
    CAPTURE(c.shards);
    CAPTURE(c.b);
    auto rt = sharded_runtime(c.shards, c.b);
    auto sh = make_session(rt.get(), shard_config(t));
    f.append({sh.get()}, 0, 0, f.ctx.n);
    check_same_decodes(ref.get(), sh.get(), f, "huge shard_tokens");
  }
}

TEST_CASE("sharding: chunk-aligned ranges cover the layer in order, cut at chunk boundaries inside each shard") {
  std::mt19937_64 rng(17);
  const uint64_t chunk = 1024;
  for (int iter = 0; iter < 3000; ++iter) {
    const uint32_t shards = 1 + static_cast<uint32_t>(rng() % 6);
    const uint64_t shard_tokens = 8192 * (1 + rng() % 3);
    const uint64_t n = 1 + rng() % (shard_tokens * (shards + 1));
    // Sinks from none to past several shards.
    const uint64_t sink_end = std::min<uint64_t>(n, iter % 7 == 0 ? rng() % (3 * shard_tokens) : rng() % 300);
    INFO("n ", n, " shards ", shards, " shard_tokens ", shard_tokens, " sink_end ", sink_end);
    const auto own = ssa::shard_ranges(n, shards, shard_tokens);
    const auto r = ssa::chunk_aligned_ranges(n, shards, shard_tokens, sink_end, chunk);
    REQUIRE(r.size() == shards);
    uint64_t at = 0;
    for (uint32_t i = 0; i < shards; ++i) {
      if (r[i].size() == 0) continue;
      CHECK(r[i].begin == at);  // in order, no gap, no overlap
      at = r[i].end;
      CHECK(r[i].begin >= own[i].begin);
      CHECK(r[i].begin < own[i].end);  // starts inside its own shard
      // Past its shard by less than a chunk, or to the sinks' end (sinks over shards).
      CHECK(r[i].end <= std::min(n, std::max(own[i].end + chunk - 1, sink_end)));
      // Cut at the candidates' chunk boundaries (or at the sinks' end, or 0).
      if (r[i].begin > 0) CHECK((r[i].begin == sink_end || (r[i].begin - sink_end) % chunk == 0));
      if (r[i].begin > 0) CHECK(r[i].begin >= sink_end);
    }
    CHECK(at == n);
    CHECK(r[0].begin == 0);
  }
  // A worked case: sinks of 100 tokens, 8192-token shards: the second range
  // starts at 100 + 8 * 1024 = 8292, 100 tokens into the second shard.
  const auto r = ssa::chunk_aligned_ranges(20000, 3, 8192, 100, 1024);
  CHECK(r[0].end == 8292);
  CHECK(r[1].begin == 8292);
  CHECK(r[1].end == 100 + 16 * 1024);
  CHECK(r[2].end == 20000);
}

TEST_CASE("sharding: the shards' global top-k is topk_indices' set, ties and any split included") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const size_t n = 500 + rng() % 4000;
    std::vector<float> x(n);
    // Few distinct values in some trials (many ties), a continuum in others;
    // both signs of zero.
    const bool ties = trial % 2 == 0;
    for (size_t i = 0; i < n; ++i) {
      x[i] = ties ? static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.5f
                  : std::normal_distribution<float>(0.0f, 2.0f)(rng);
      if (i % 97 == 0) x[i] = (rng() & 1) ? 0.0f : -0.0f;
    }
    const uint64_t k = trial % 5 == 0 ? n : rng() % n;  // k = n, 0 included
    std::vector<uint32_t> want;
    ssa::topk_indices(x.data(), n, k, 0, &want);
    std::sort(want.begin(), want.end());
    const uint32_t ranks = 2 + static_cast<uint32_t>(trial % 3);
    // Arbitrary cuts (empty shards too).
    std::vector<size_t> cut = {0};
    for (uint32_t r = 1; r < ranks; ++r) cut.push_back(rng() % (n + 1));
    cut.push_back(n);
    std::sort(cut.begin(), cut.end());
    ssa::ThreadPool pool(2);
    std::vector<std::vector<uint32_t>> got_by_rank(ranks);
    ssa::InProcessGroup group(ranks);
    const absl::Status st = group.run([&](ssa::Collective& comm) -> absl::Status {
      const uint32_t r = comm.rank();
      // Two units: the one under test and a second with another k, to check
      // that the units of one call do not mix.
      std::vector<ssa::TopkUnit> units = {{x.data() + cut[r], cut[r + 1] - cut[r], k, n},
                                          {x.data() + cut[r], cut[r + 1] - cut[r], n / 3, n}};
      std::vector<std::vector<uint32_t>> out;
      SSA_RETURN_IF_ERROR(ssa::sharded_topk(comm, pool, units, &out));
      for (uint32_t i : out[0]) got_by_rank[r].push_back(static_cast<uint32_t>(cut[r] + i));
      return absl::OkStatus();
    });
    REQUIRE(st.ok());
    std::vector<uint32_t> got;
    for (auto& g : got_by_rank) got.insert(got.end(), g.begin(), g.end());
    std::sort(got.begin(), got.end());
    CAPTURE(trial);
    CHECK(got == want);
  }
}

TEST_CASE("sharding: residual draws split by mass over chunk-aligned ranges are the whole sample's") {
  std::mt19937_64 rng(9);
  const uint64_t first = 130, n = 3 * 8192 + 1500;  // candidates [130, 130 + n)
  std::vector<float> w(n);
  std::exponential_distribution<float> ex(1.0f);
  for (float& x : w) x = std::min(1.0f, ex(rng) * 0.1f) * ((rng() % 9 == 0) ? 0.0f : 1.0f);
  ssa::FixedHierarchy whole;
  whole.build(w.data(), first, n);
  const ssa::RngStream stream = ssa::make_rng_stream(77, 3, 1, 5);
  const uint64_t m = 5000;
  std::vector<uint32_t> want;
  ssa::draw_range(whole, 0, whole.total(), m, stream, &want);
  REQUIRE(want.size() == m);
  // Ranges cut at shard boundaries (multiples of 8192 in absolute tokens).
  const uint64_t cuts[] = {first, 8192, 16384, 24576, first + n};
  std::vector<ssa::FixedHierarchy> parts(4);
  uint64_t grand = 0;
  for (int r = 0; r < 4; ++r) {
    parts[r].build(w.data() + (cuts[r] - first), cuts[r], cuts[r + 1] - cuts[r]);
    grand += parts[r].total();
  }
  CHECK(grand == whole.total());
  std::vector<uint32_t> got;
  uint64_t offset = 0;
  for (int r = 0; r < 4; ++r) {
    ssa::draw_range(parts[r], offset, grand, m, stream, &got);
    offset += parts[r].total();
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  // And the draws follow the weights: a chi-square-free check that zero-weight
  // tokens are never drawn and the heaviest region is drawn most.
  for (uint32_t t : want) CHECK(w[t - first] > 0.0f);
}

TEST_CASE("sharding: every method, group mode and dtype decodes bitwise as unsharded on 2, 3 and 4 shards") {
  auto ref_rt = make_runtime(2);
  for (ssa_dtype t : kDtypes) {
    CAPTURE(t);
    const StructuredFeed f(3 * kShard + 2900, t, 100 + static_cast<uint64_t>(t));
    auto ref = make_session(ref_rt.get(), shard_config(t));
    std::vector<RuntimePtr> rts;
    std::vector<SessionPtr> sh;
    for (uint32_t n_shards : {2u, 3u, 4u}) {
      rts.push_back(sharded_runtime(n_shards, kShard));
      sh.push_back(make_session(rts.back().get(), shard_config(t)));
    }
    std::vector<ssa_session*> all = {ref.get()};
    for (auto& s : sh) all.push_back(s.get());
    // Appends whose ends fall inside shards and inside pages.
    f.append(all, 0, 0, 5003);
    f.append(all, 0, 5003, 12001);
    f.append(all, 0, 12001, f.ctx.n);
    f.append(all, 1, 0, 9100);  // layer 1 uses two shards
    for (size_t i = 0; i < sh.size(); ++i) check_same_decodes(ref.get(), sh[i].get(), f, "fresh");
  }
}

TEST_CASE("sharding: forks, truncations that drop shards and appends across boundaries") {
  auto ref_rt = make_runtime(2);
  auto sh_rt = sharded_runtime(4, kShard);
  const ssa_dtype t = SSA_DTYPE_BF16;
  const StructuredFeed f(4 * kShard + 3000, t, 41);
  auto ref = make_session(ref_rt.get(), shard_config(t));
  auto sh = make_session(sh_rt.get(), shard_config(t));
  f.append({ref.get(), sh.get()}, 0, 0, 3 * kShard + 500);
  f.append({ref.get(), sh.get()}, 1, 0, 3 * kShard + 500);
  ssa_session *rf = nullptr, *sf = nullptr;
  SSA_CHECK_OK(ssa_session_fork(ref.get(), &rf));
  SSA_CHECK_OK(ssa_session_fork(sh.get(), &sf));
  SessionPtr ref_fork(rf), sh_fork(sf);
  // The fork drops its last two shards, then grows back over a boundary.
  SSA_CHECK_OK(ssa_session_truncate(ref_fork.get(), 2 * kShard - 300));
  SSA_CHECK_OK(ssa_session_truncate(sh_fork.get(), 2 * kShard - 300));
  check_same_decodes(ref_fork.get(), sh_fork.get(), f, "truncated fork");
  f.append({ref_fork.get(), sh_fork.get()}, 0, 2 * kShard - 300, 2 * kShard + 4000);
  f.append({ref_fork.get(), sh_fork.get()}, 1, 2 * kShard - 300, 2 * kShard + 100);
  check_same_decodes(ref_fork.get(), sh_fork.get(), f, "fork after append");
  // The originals are untouched by their forks and keep growing into shard 4.
  f.append({ref.get(), sh.get()}, 0, 3 * kShard + 500, f.ctx.n);
  check_same_decodes(ref.get(), sh.get(), f, "original after append");
  // Down to one shard, then to nothing, then a new start.
  SSA_CHECK_OK(ssa_session_truncate(ref.get(), 5000));
  SSA_CHECK_OK(ssa_session_truncate(sh.get(), 5000));
  check_same_decodes(ref.get(), sh.get(), f, "one shard left");
  SSA_CHECK_OK(ssa_session_truncate(ref.get(), 0));
  SSA_CHECK_OK(ssa_session_truncate(sh.get(), 0));
  f.append({ref.get(), sh.get()}, 0, 0, kShard + 77);
  check_same_decodes(ref.get(), sh.get(), f, "regrown from empty");
}

TEST_CASE("sharding: one snapshot, the same file, loads on any shard count") {
  auto ref_rt = make_runtime(2);
  auto four = sharded_runtime(4, kShard);
  const ssa_dtype t = SSA_DTYPE_F16;
  const StructuredFeed f(3 * kShard + 1234, t, 77);
  auto ref = make_session(ref_rt.get(), shard_config(t));
  auto sh = make_session(four.get(), shard_config(t));
  f.append({ref.get(), sh.get()}, 0, 0, f.ctx.n);
  f.append({ref.get(), sh.get()}, 1, 0, 2 * kShard + 5);
  const std::string p_ref = temp_path("ref"), p_sh = temp_path("sharded");
  SSA_CHECK_OK(ssa_session_save(ref.get(), p_ref.c_str()));
  SSA_CHECK_OK(ssa_session_save(sh.get(), p_sh.c_str()));
  // A sharded session saves what an unsharded one does: the same format, the
  // same sections of the same sizes (files differ only in their random file id).
  ssa_snapshot_info a, b;
  ssa_snapshot_info_init(&a);
  ssa_snapshot_info_init(&b);
  SSA_CHECK_OK(ssa_snapshot_inspect(p_ref.c_str(), &a));
  SSA_CHECK_OK(ssa_snapshot_inspect(p_sh.c_str(), &b));
  CHECK(a.format_version == b.format_version);
  CHECK(a.n_sections == b.n_sections);
  CHECK(a.file_bytes == b.file_bytes);
  CHECK(a.live_bytes == b.live_bytes);
  CHECK(a.length == b.length);
  CHECK(a.max_layer_length == b.max_layer_length);
  CHECK(file_bytes(p_ref).size() == file_bytes(p_sh).size());
  // Loaded on one shard (unsharded), on 2 shards of another budget, on 3.
  auto two = sharded_runtime(2, 2 * kShard), three = sharded_runtime(3, kShard);
  for (ssa_runtime* rt : {ref_rt.get(), two.get(), three.get(), four.get()}) {
    CAPTURE(ssa_runtime_num_shards(rt));
    ssa_session* loaded = nullptr;
    SSA_CHECK_OK(ssa_session_load(rt, p_sh.c_str(), 0, &loaded));
    SessionPtr l(loaded);
    check_same_decodes(ref.get(), l.get(), f, "loaded");
  }
  // An unsharded snapshot loaded on 4 shards, then grown there.
  ssa_session* loaded = nullptr;
  SSA_CHECK_OK(ssa_session_load(four.get(), p_ref.c_str(), SSA_LOAD_MMAP, &loaded));
  SessionPtr l(loaded);
  f.append({ref.get(), l.get()}, 1, 2 * kShard + 5, f.ctx.n);
  check_same_decodes(ref.get(), l.get(), f, "mapped and grown");
  remove(p_ref.c_str());
  remove(p_sh.c_str());
}

TEST_CASE("sharding: batch decode of sharded sessions equals the unsharded batch") {
  auto ref_rt = make_runtime(2);
  auto sh_rt = sharded_runtime(3, kShard);
  const ssa_dtype t = SSA_DTYPE_F16;
  const StructuredFeed f(2 * kShard + 4000, t, 5);
  auto r1 = make_session(ref_rt.get(), shard_config(t)), r2 = make_session(ref_rt.get(), shard_config(t));
  auto s1 = make_session(sh_rt.get(), shard_config(t)), s2 = make_session(sh_rt.get(), shard_config(t));
  f.append({r1.get(), s1.get()}, 0, 0, f.ctx.n);
  f.append({r2.get(), s2.get()}, 0, 0, kShard + 10);
  const std::vector<uint8_t>& q = f.q;
  for (ssa_method m : kAllMethods) {
    CAPTURE(m);
    ssa_decode_params p = params(m, 0, 25.0f);
    p.step = 4;
    std::vector<std::vector<uint8_t>> outs(6, std::vector<uint8_t>(q.size(), 0));
    ssa_decode_item ri[3] = {{r1.get(), q.data(), outs[0].data()}, {r2.get(), q.data(), outs[1].data()},
                             {r1.get(), q.data(), outs[2].data()}};
    ssa_decode_item si[3] = {{s1.get(), q.data(), outs[3].data()}, {s2.get(), q.data(), outs[4].data()},
                             {s1.get(), q.data(), outs[5].data()}};
    SSA_CHECK_OK(ssa_decode_batch(ri, 3, 0, &p));
    SSA_CHECK_OK(ssa_decode_batch(si, 3, 0, &p));
    CHECK(outs[0] == outs[3]);
    CHECK(outs[1] == outs[4]);
    CHECK(outs[2] == outs[5]);
  }
}

TEST_CASE("sharding: a sharded decode is the estimator (dense against float64)") {
  auto sh_rt = sharded_runtime(3, kShard);
  const ssa_dtype t = SSA_DTYPE_F32;
  const StructuredFeed f(2 * kShard + 999, t, 8);
  auto s = make_session(sh_rt.get(), shard_config(t));
  f.append({s.get()}, 0, 0, f.ctx.n);
  const auto out = run_decode(s.get(), 0, f.ctx.q, t, params(SSA_METHOD_DENSE));
  const size_t n = f.ctx.n, d = 64;
  const std::vector<double> K = quantised(f.ctx.K, t), V = quantised(f.ctx.V, t);
  for (uint32_t h = 0; h < 8; ++h) {
    const uint32_t kv = h / 4;
    const std::vector<double> kh = head_rows(K, n, 2, d, kv), vh = head_rows(V, n, 2, d, kv);
    std::vector<double> qh(f.ctx.q.begin() + h * d, f.ctx.q.begin() + (h + 1) * d);
    const auto ref = dense_attention_f64(qh.data(), kh.data(), vh.data(), n, d);
    std::vector<double> got(out.begin() + h * d, out.begin() + (h + 1) * d);
    CHECK(rel_l2(got.data(), ref.data(), d) < 1e-4);
  }
}

TEST_CASE("sharding: traced decodes of sharded sessions list the unsharded rows, log_pi and output bitwise") {
  auto ref_rt = make_runtime(2);
  const ssa_dtype t = SSA_DTYPE_F32;
  const StructuredFeed f(2 * kShard + 1500, t, 23);
  auto ref = make_session(ref_rt.get(), shard_config(t));
  f.append({ref.get()}, 0, 0, f.ctx.n);
  const std::vector<uint8_t>& q = f.q;
  const uint32_t nq = 8;
  const uint64_t cap = uint64_t{nq} * f.ctx.n;
  struct Trace {
    std::vector<uint8_t> out;
    ssa_decode_stats stats;
    std::vector<uint32_t> tokens;
    std::vector<float> log_pi;
    std::vector<uint64_t> offsets;
  };
  auto traced = [&](ssa_session* s, const ssa_decode_params& p) {
    Trace r;
    r.out.assign(q.size(), 0);
    ssa_decode_stats_init(&r.stats);
    r.tokens.assign(cap, 0);
    r.log_pi.assign(cap, 0.0f);
    r.offsets.assign(nq + 1, 0);
    SSA_CHECK_OK(ssa_decode_traced(s, 0, q.data(), r.out.data(), &p, &r.stats, r.tokens.data(), r.log_pi.data(),
                                   cap, r.offsets.data()));
    r.tokens.resize(r.offsets[nq]);
    r.log_pi.resize(r.offsets[nq]);
    return r;
  };
  for (uint32_t n_shards : {2u, 3u}) {
    auto rt = sharded_runtime(n_shards, kShard);
    auto sh = make_session(rt.get(), shard_config(t));
    f.append({sh.get()}, 0, 0, f.ctx.n);
    size_t compared = 0;
    for (const ssa_decode_params& p : param_grid()) {
      CAPTURE(n_shards);
      CAPTURE(p.method);
      CAPTURE(p.group_selection);
      CAPTURE(p.n_local);
      const Trace a = traced(ref.get(), p), b = traced(sh.get(), p);
      CHECK(a.out == b.out);
      CHECK(same_stats(a.stats, b.stats));
      CHECK(a.offsets == b.offsets);
      CHECK(a.tokens == b.tokens);
      CHECK(memcmp(a.log_pi.data(), b.log_pi.data(), a.log_pi.size() * sizeof(float)) == 0);
      CHECK(b.offsets[nq] == b.stats.tokens_read);
      // And the same output as the plain decode of the sharded session.
      const Outcome plain = decode_raw(sh.get(), 0, q, p);
      CHECK(plain.out == b.out);
      ++compared;
    }
    CHECK(compared > 0);
  }
}

TEST_CASE("sharding: error-targeted decode of a sharded session is UNSUPPORTED, out untouched") {
  auto sh_rt = sharded_runtime(2, kShard);
  const ssa_dtype t = SSA_DTYPE_F16;
  const StructuredFeed f(kShard + 3000, t, 3);
  auto s = make_session(sh_rt.get(), shard_config(t));
  f.append({s.get()}, 0, 0, f.ctx.n);
  ssa_decode_params p = params(SSA_METHOD_SSA);
  p.target_error = 0.05f;
  const std::vector<uint8_t>& q = f.q;
  std::vector<uint8_t> out(q.size(), 0x5A);
  CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, nullptr) == SSA_ERR_UNSUPPORTED);
  CHECK(std::string(ssa_last_error_message()).find("sharded session") != std::string::npos);
  CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0x5A; }));
}

TEST_CASE("sharding: bad options give clear errors and no runtime") {
  ssa_runtime* rt = nullptr;
  const int32_t devs[] = {0, 1, 2, 1};
  auto base = [] {
    ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 1);
    return o;
  };
  auto expect = [&](const ssa_runtime_options& o, ssa_status want, const char* words) {
    rt = nullptr;
    CHECK(ssa_runtime_create(&o, &rt) == want);
    CHECK(rt == nullptr);
    CAPTURE(ssa_last_error_message());
    CHECK(std::string(ssa_last_error_message()).find(words) != std::string::npos);
  };
  ssa_runtime_options o = base();
  o.devices = devs;
  o.n_devices = 0;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "n_devices 0");
  o.n_devices = 65;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "1..64");
  o.n_devices = 4;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "repeats devices[1]");
  const int32_t neg[] = {0, -2};
  o.devices = neg;
  o.n_devices = 2;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "negative");
  o = base();
  o.n_devices = 2;  // no list
  expect(o, SSA_ERR_INVALID_ARGUMENT, "devices NULL");
  o = base();
  o.shard_tokens = 10000;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "multiple of 8192");
  o = base();
  int dummy = 0;
  o.communicator = &dummy;
#if defined(SSA_HAVE_NCCL) && SSA_HAVE_NCCL
  // A build with NCCL reads the communicator: only refusals that come first.
  o.backend = SSA_BACKEND_CPU;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "collective");
#else
  expect(o, SSA_ERR_UNSUPPORTED, "no NCCL");
#endif
  ssa_collective table;
  ssa_collective_init(&table);
  o.collective = &table;
  expect(o, SSA_ERR_INVALID_ARGUMENT, "both set");
  o = base();
  o.backend = SSA_BACKEND_CUDA;
  o.devices = devs;
  o.n_devices = 2;
  o.device_kv_budget = uint64_t{1} << 30;  // refused before any device is looked at
  expect(o, SSA_ERR_UNSUPPORTED, "device_kv_budget");
  o.device_kv_budget = 0;
  rt = nullptr;
  const ssa_status cuda = ssa_runtime_create(&o, &rt);
  // CUDA not built (UNSUPPORTED), or no device 1 (DEVICE); with two GPUs, a runtime.
  CAPTURE(ssa_last_error_message());
  CHECK((cuda == SSA_ERR_UNSUPPORTED || cuda == SSA_ERR_DEVICE || cuda == SSA_OK));
  CHECK((cuda == SSA_OK) == (rt != nullptr));
  ssa_runtime_destroy(rt);
  // Good ones: a list of one is unsharded; the default budget.
  o = base();
  o.devices = devs + 2;
  o.n_devices = 1;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  CHECK(ssa_runtime_num_shards(rt) == 1);
  ssa_runtime_destroy(rt);
  o.devices = devs;
  o.n_devices = 3;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  CHECK(ssa_runtime_num_shards(rt) == 3);
  ssa_runtime_destroy(rt);
  CHECK(ssa_runtime_num_shards(nullptr) == 0);
}

TEST_CASE("sharding: small heads, small pages, groups of two") {
  auto ref_rt = make_runtime(2);
  auto sh_rt = sharded_runtime(2, kShard);
  const StructuredContext ctx = make_structured_context(kShard + 900, 2, 4, 32);
  ssa_session_config c = make_config(1, 4, 2, 32, SSA_DTYPE_F16);
  c.page_tokens = 16;
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  c.index_min_tokens = 64;
  c.index_train_sample = 256;
  c.index_iterations = 2;
  auto ref = make_session(ref_rt.get(), c), sh = make_session(sh_rt.get(), c);
  for (ssa_session* s : {ref.get(), sh.get()}) {
    append_f32(s, 0, ctx.K, ctx.V, ctx.n, SSA_DTYPE_F16);
    SSA_CHECK_OK(ssa_session_update_index(s));
  }
  const std::vector<uint8_t> q = encode(ctx.q, SSA_DTYPE_F16);
  for (ssa_method m : kAllMethods) {
    for (uint32_t mode : kGroupModes) {
      for (float sparsity : {4.0f, 20.0f}) {
        CAPTURE(m);
        CAPTURE(mode);
        CAPTURE(sparsity);
        ssa_decode_params p = params(m, 0, sparsity);
        p.group_selection = mode;
        p.step = 5;
        const Outcome a = decode_raw(ref.get(), 0, q, p), b = decode_raw(sh.get(), 0, q, p);
        CHECK(a.out == b.out);
        CHECK(same_stats(a.stats, b.stats));
      }
    }
  }
}

TEST_CASE("sharding: 4-bit score-aware proxies decode bitwise as unsharded") {
  auto ref_rt = make_runtime(2);
  const StructuredFeed f(2 * kShard + 1500, SSA_DTYPE_F32, 170);
  ssa_session_config c = shard_config(SSA_DTYPE_F32);
  c.proxy = SSA_PROXY_OPQ4;
  c.pq_subspaces = 32;
  c.pq_parallel_weight = 4.0f;
  auto ref = make_session(ref_rt.get(), c);
  auto rt = sharded_runtime(2, kShard);
  auto sh = make_session(rt.get(), c);
  f.append({ref.get(), sh.get()}, 0, 0, 7001);
  f.append({ref.get(), sh.get()}, 0, 7001, f.ctx.n);
  f.append({ref.get(), sh.get()}, 1, 0, 9100);
  check_same_decodes(ref.get(), sh.get(), f, "opq4, weight 4");
}

TEST_CASE("sharding: a query-aware 4-bit score-aware proxy decodes bitwise as unsharded") {
  auto ref_rt = make_runtime(2);
  const StructuredFeed f(2 * kShard + 1500, SSA_DTYPE_F32, 170);
  ssa_session_config c = shard_config(SSA_DTYPE_F32);
  c.proxy = SSA_PROXY_QPQ4;
  c.pq_subspaces = 32;
  c.pq_parallel_weight = 4.0f;
  auto ref = make_session(ref_rt.get(), c);
  auto rt = sharded_runtime(2, kShard);
  auto sh = make_session(rt.get(), c);
  // The queries the index learns from: the context's query and a scaled copy.
  std::vector<float> shown = f.ctx.q;
  for (float x : f.ctx.q) shown.push_back(0.5f * x + 0.1f);
  for (ssa_session* s : {ref.get(), sh.get()})
    for (uint32_t layer = 0; layer < 2; ++layer) SSA_CHECK_OK(ssa_session_observe_queries(s, layer, shown.data(), 2));
  f.append({ref.get(), sh.get()}, 0, 0, 7001);
  f.append({ref.get(), sh.get()}, 0, 7001, f.ctx.n);
  f.append({ref.get(), sh.get()}, 1, 0, 9100);
  check_same_decodes(ref.get(), sh.get(), f, "qpq4, weight 4");
}
