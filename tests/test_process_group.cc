// A runtime that is one rank of a group of processes (ssa_runtime_options.collective,
// docs/DISTRIBUTED.md), through the public C API: the ranks run here as threads,
// each with a runtime of its own whose collective callbacks go through a shared
// in-memory transport (with a real timeout), as a process's would go through MPI
// or gloo. Each rank keeps exactly its shard's pages and the unsharded session's
// codebooks; every method and group_selection mode decodes bitwise as an
// unsharded runtime does, with 1 to 4 ranks, after appends that cross shard
// boundaries, fork, truncate; a group's snapshot (a file per rank and a
// manifest) loads into groups of 1 to 4 ranks and into one process, and one
// process's snapshot into groups; damaged or incomplete sets are refused on
// every rank; a batch is the unsharded batch; a rank that stops answering gives
// the others SSA_ERR_IO within the timeout (decode, index training, save) and
// leaves the group refusing further calls; ranks that disagree on q, on the
// layer, on the rows of an append that trains, or on what they load get an
// error without waiting; bad tables are refused. The same over
// torch.distributed (gloo) with real processes is
// bindings/python/tests/test_distributed.py.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <dirent.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "session.h"
#include "shard/shard_map.h"
#include "snapshot/group_manifest.h"
#include "status.h"
#include "snapshot/format.h"
#include "support/memory_transport.h"
#include "support/session_helpers.h"
#include "support/structured_feed.h"

using namespace ssa_test;
using namespace ssa_test::transport;

namespace {

constexpr uint64_t kShard = 8192;
constexpr uint32_t kGroupModes[] = {SSA_GROUP_OFF, SSA_GROUP_MIXTURE, SSA_GROUP_MEAN_QUERY};

RuntimePtr group_runtime(RankLink* link, uint32_t timeout_ms = 20000) {
  ssa_collective c = table_of(link, timeout_ms);
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 1);
  o.seed = 1234;
  o.shard_tokens = kShard;
  o.collective = &c;
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  return RuntimePtr(rt);
}

RuntimePtr plain_runtime() {
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 2);
  o.seed = 1234;
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  return RuntimePtr(rt);
}

// One f16 layer; the ranks' sessions and the unsharded reference are fed alike.
ssa_session_config group_config() { return quick_index_config(1, SSA_DTYPE_F16); }

// Appends in chunks whose ends fall inside shards and across their boundaries.
void feed_chunks(const StructuredFeed& f, ssa_session* s, size_t n) {
  size_t t = 0;
  const size_t chunks[] = {5000, 7000, 9000, 1};
  for (size_t i = 0; t < n; ++i) {
    const size_t e = std::min(n, t + chunks[i % 4]);
    f.append({s}, 0, t, e);
    t = e;
  }
}

std::vector<ssa_decode_params> param_grid() {
  std::vector<ssa_decode_params> grid;
  for (ssa_method m : kAllMethods) {
    for (uint32_t mode : kGroupModes) {
      if (m == SSA_METHOD_DENSE && mode != SSA_GROUP_OFF) continue;
      ssa_decode_params p = params(m, 0, 20.0f);
      p.group_selection = mode;
      p.step = 11;
      p.n_local = 700;
      grid.push_back(p);
    }
  }
  grid.push_back(params(SSA_METHOD_SSA, 200));  // sink + local only
  return grid;
}

struct Outcome {
  std::vector<uint8_t> out;
  ssa_decode_stats stats;
  ssa_status st = SSA_OK;
};

Outcome decode_one(ssa_session* s, const std::vector<uint8_t>& q, const ssa_decode_params& p) {
  Outcome o;
  o.out.assign(q.size(), 0xAB);
  ssa_decode_stats_init(&o.stats);
  o.st = ssa_decode(s, 0, q.data(), o.out.data(), &p, &o.stats);
  return o;
}

std::vector<Outcome> decode_grid(ssa_session* s, const std::vector<uint8_t>& q) {
  std::vector<Outcome> r;
  for (const ssa_decode_params& p : param_grid()) r.push_back(decode_one(s, q, p));
  return r;
}

bool same(const Outcome& a, const Outcome& b) {
  return a.st == SSA_OK && b.st == SSA_OK && a.out == b.out && same_stats(a.stats, b.stats);
}

void check_same_grid(const std::vector<Outcome>& ref, const std::vector<std::vector<Outcome>>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    REQUIRE(ranks[r].size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(same(ref[i], ranks[r][i]));
    }
  }
}

std::string temp_path(const char* name) {
  return std::string("/tmp/ssa_group_") + std::to_string(getpid()) + "_" + name + ".ssa";
}

// The files of /tmp whose names start with the base name of `path` and a dot
// (a group's rank files beside its manifest).
std::vector<std::string> rank_files(const std::string& path) {
  const std::string base = path.substr(path.find_last_of('/') + 1) + ".";
  std::vector<std::string> out;
  DIR* d = opendir("/tmp");
  while (const dirent* e = d != nullptr ? readdir(d) : nullptr) {
    const std::string name = e->d_name;
    if (name.compare(0, base.size(), base) == 0 && name.find(".rank") != std::string::npos) {
      out.push_back("/tmp/" + name);
    }
  }
  if (d != nullptr) closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void remove_set(const std::string& path) {
  for (const std::string& f : rank_files(path)) unlink(f.c_str());
  unlink(path.c_str());
}

// Rank `rank` of `ranks` keeps exactly the KV and code pages of its shard.
void check_holds_only_its_shard(const ssa_session* s, uint32_t rank, uint32_t ranks) {
  const ssa::HeldRange held = ssa::held_tokens(rank, ranks, kShard);
  for (const ssa::LayerStore& l : s->layers) {
    const uint64_t pages = s->layout.pages_for(l.n_tokens);
    REQUIRE(l.kv_pages.size() >= pages);
    for (uint64_t j = 0; j < pages; ++j) {
      CAPTURE(j);
      const bool mine = held.holds_page(j, s->layout.page_tokens);
      CHECK((l.kv_pages[j] != nullptr) == mine);
      if (l.codebooks != nullptr) CHECK((l.code_pages[j] != nullptr) == mine);
    }
  }
}

}  // namespace

TEST_CASE("process group: every method and group mode bitwise the unsharded decode, 1-4 ranks") {
  const size_t n = 29000;  // shards of 8192: 4 ranks hold 8192, 8192, 8192, 4424
  const StructuredFeed f(n, SSA_DTYPE_F16, 21);
  RuntimePtr plain = plain_runtime();
  ssa_session* ref = nullptr;
  const ssa_session_config cfg = group_config();
  SSA_CHECK_OK(ssa_session_create(plain.get(), &cfg, &ref));
  SessionPtr ref_owner(ref);
  feed_chunks(f, ref, n);
  const std::vector<Outcome> want = decode_grid(ref, f.q);
  // The reference is not trivially equal to anything: the grid's outputs differ.
  CHECK(want[0].out != want[1].out);
  for (uint32_t ranks = 1; ranks <= 4; ++ranks) {
    CAPTURE(ranks);
    std::vector<std::vector<Outcome>> got(ranks);
    run_ranks(ranks, [&](uint32_t r, RankLink& link) {
      RuntimePtr rt = group_runtime(&link);
      REQUIRE(ssa_runtime_num_shards(rt.get()) == ranks);
      REQUIRE(ssa_runtime_rank(rt.get()) == r);
      ssa_session* s = nullptr;
      SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
      SessionPtr owner(s);
      feed_chunks(f, s, n);
      got[r] = decode_grid(s, f.q);
      CHECK(link.calls > 0);
      check_holds_only_its_shard(s, r, ranks);
      // Trained on the sample gathered over the group: the unsharded codebooks, bitwise.
      REQUIRE(s->layers[0].codebooks != nullptr);
      CHECK(s->layers[0].codebooks->data == ref->layers[0].codebooks->data);
      CHECK(s->layers[0].trained_at_tokens == ref->layers[0].trained_at_tokens);
    });
    check_same_grid(want, got);
  }
}

TEST_CASE("process group: fork, truncate into a shard, regrowth, and a batch") {
  const size_t n = 26000;
  const StructuredFeed f(n, SSA_DTYPE_F16, 22);
  const ssa_session_config cfg = group_config();
  RuntimePtr plain = plain_runtime();
  ssa_session *ref = nullptr, *ref_fork = nullptr;
  SSA_CHECK_OK(ssa_session_create(plain.get(), &cfg, &ref));
  SessionPtr o1(ref);
  f.append({ref}, 0, 0, 20000);
  SSA_CHECK_OK(ssa_session_fork(ref, &ref_fork));
  SessionPtr o2(ref_fork);
  SSA_CHECK_OK(ssa_session_truncate(ref, 9000));  // into the second shard
  f.append({ref}, 0, 9000, n);
  f.append({ref_fork}, 0, 20000, 23000);
  const std::vector<Outcome> want = decode_grid(ref, f.q), want_fork = decode_grid(ref_fork, f.q);
  std::vector<uint8_t> want_batch(2 * f.q.size());
  ssa_decode_item items[2] = {{ref, f.q.data(), want_batch.data()},
                              {ref_fork, f.q.data(), want_batch.data() + f.q.size()}};
  const ssa_decode_params bp = params(SSA_METHOD_SSA, 0, 20.0f);
  SSA_CHECK_OK(ssa_decode_batch(items, 2, 0, &bp));
  std::vector<std::vector<Outcome>> got(3), got_fork(3);
  std::vector<std::vector<uint8_t>> got_batch(3);
  run_ranks(3, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link);
    ssa_session *s = nullptr, *fork = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 20000);
    SSA_CHECK_OK(ssa_session_fork(s, &fork));
    SessionPtr b(fork);
    SSA_CHECK_OK(ssa_session_truncate(s, 9000));
    f.append({s}, 0, 9000, n);
    f.append({fork}, 0, 20000, 23000);
    got[r] = decode_grid(s, f.q);
    got_fork[r] = decode_grid(fork, f.q);
    check_holds_only_its_shard(s, r, 3);
    check_holds_only_its_shard(fork, r, 3);
    got_batch[r].assign(2 * f.q.size(), 0);
    ssa_decode_item it[2] = {{s, f.q.data(), got_batch[r].data()},
                             {fork, f.q.data(), got_batch[r].data() + f.q.size()}};
    SSA_CHECK_OK(ssa_decode_batch(it, 2, 0, &bp));
  });
  check_same_grid(want, got);
  check_same_grid(want_fork, got_fork);
  for (uint32_t r = 0; r < 3; ++r) CHECK(got_batch[r] == want_batch);
}

TEST_CASE("process group: a group's snapshot is a file per rank and a manifest; it loads into 1-4 ranks and one process") {
  const size_t n = 25000;
  const StructuredFeed f(n, SSA_DTYPE_F16, 23);
  const ssa_session_config cfg = group_config();
  const std::string path = temp_path("save");
  remove_set(path);
  std::vector<std::vector<Outcome>> saved(3);
  run_ranks(3, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    feed_chunks(f, s, n);
    SSA_CHECK_OK(ssa_session_update_index(s));
    const char meta[] = "agent 7";
    SSA_CHECK_OK(ssa_session_set_metadata(s, meta, sizeof meta));
    SSA_CHECK_OK(ssa_session_save(s, path.c_str()));  // collective: every rank
    saved[r] = decode_grid(s, f.q);
  });
  const std::vector<std::string> first_set = rank_files(path);
  CHECK(first_set.size() == 3);
  ssa_snapshot_info info;
  ssa_snapshot_info_init(&info);
  SSA_CHECK_OK(ssa_snapshot_inspect(path.c_str(), &info));
  CHECK(info.length == n);
  CHECK(info.indexed_layers == 1);
  // A rank file alone is a part, not a session.
  RuntimePtr plain = plain_runtime();
  ssa_session* part = nullptr;
  CHECK(ssa_session_load(plain.get(), first_set[1].c_str(), 0, &part) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(part == nullptr);
  ssa_session* one = nullptr;
  SSA_CHECK_OK(ssa_session_load(plain.get(), path.c_str(), SSA_LOAD_VERIFY, &one));
  SessionPtr o(one);
  const std::vector<Outcome> want = decode_grid(one, f.q);
  check_same_grid(want, saved);
  size_t meta_n = 0;
  SSA_CHECK_OK(ssa_session_get_metadata(one, nullptr, 0, &meta_n));
  CHECK(meta_n == sizeof "agent 7");
  for (uint32_t ranks = 1; ranks <= 4; ++ranks) {
    CAPTURE(ranks);
    for (uint32_t flags : {0u, unsigned{SSA_LOAD_MMAP}}) {
      CAPTURE(flags);
      std::vector<std::vector<Outcome>> got(ranks);
      run_ranks(ranks, [&](uint32_t r, RankLink& link) {
        RuntimePtr rt = group_runtime(&link);
        ssa_session* s = nullptr;
        SSA_CHECK_OK(ssa_session_load(rt.get(), path.c_str(), flags, &s));
        SessionPtr a(s);
        check_holds_only_its_shard(s, r, ranks);
        got[r] = decode_grid(s, f.q);
        if (ranks == 2 && flags == 0) {
          // Saved again by a group of another size (checkpoint: a full save
          // for a group): the earlier set's rank files are removed.
          SSA_CHECK_OK(ssa_session_checkpoint(s, path.c_str()));
        }
      });
      check_same_grid(want, got);
    }
  }
  const std::vector<std::string> second_set = rank_files(path);
  CHECK(second_set.size() == 2);
  for (const std::string& old : first_set) CHECK(access(old.c_str(), F_OK) != 0);
  ssa_session* again = nullptr;
  SSA_CHECK_OK(ssa_session_load(plain.get(), path.c_str(), 0, &again));
  SessionPtr o2(again);
  check_same_grid(want, {decode_grid(again, f.q)});

  // One process's snapshot loads into groups, each rank reading its shard.
  const std::string single = temp_path("single");
  SSA_CHECK_OK(ssa_session_save(one, single.c_str()));
  for (uint32_t ranks : {2u, 4u}) {
    std::vector<std::vector<Outcome>> got(ranks);
    run_ranks(ranks, [&](uint32_t r, RankLink& link) {
      RuntimePtr rt = group_runtime(&link);
      ssa_session* s = nullptr;
      SSA_CHECK_OK(ssa_session_load(rt.get(), single.c_str(), 0, &s));
      SessionPtr a(s);
      check_holds_only_its_shard(s, r, ranks);
      got[r] = decode_grid(s, f.q);
    });
    check_same_grid(want, got);
  }
  unlink(single.c_str());
  remove_set(path);
}

TEST_CASE("process group: a damaged, incomplete or mixed set is refused, on every rank") {
  const size_t n = 20000;
  const StructuredFeed f(n, SSA_DTYPE_F16, 26);
  const ssa_session_config cfg = group_config();
  const std::string path = temp_path("bad"), older = temp_path("older");
  remove_set(path);
  remove_set(older);
  run_ranks(2, [&](uint32_t, RankLink& link) {
    RuntimePtr rt = group_runtime(&link);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 17000);
    SSA_CHECK_OK(ssa_session_save(s, older.c_str()));
    f.append({s}, 0, 17000, n);
    SSA_CHECK_OK(ssa_session_save(s, path.c_str()));
  });
  RuntimePtr plain = plain_runtime();
  auto load_plain = [&]() {
    ssa_session* s = nullptr;
    const ssa_status st = ssa_session_load(plain.get(), path.c_str(), 0, &s);
    ssa_session_destroy(s);
    return st;
  };
  auto load_group = [&](const std::string& p0, const std::string& p1) {
    std::vector<ssa_status> st(2);
    run_ranks(2, [&](uint32_t r, RankLink& link) {
      RuntimePtr rt = group_runtime(&link, 5000);
      ssa_session* s = nullptr;
      st[r] = ssa_session_load(rt.get(), (r == 0 ? p0 : p1).c_str(), 0, &s);
      CHECK((s != nullptr) == (st[r] == SSA_OK));
      ssa_session_destroy(s);
    });
    return st;
  };
  SSA_CHECK_OK(load_plain());
  const std::vector<std::string> files = rank_files(path), old_files = rank_files(older);
  REQUIRE(files.size() == 2);
  REQUIRE(old_files.size() == 2);
  auto copy = [](const std::string& from, const std::string& to) {
    FILE* a = fopen(from.c_str(), "rb");
    FILE* b = fopen(to.c_str(), "wb");
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, k, b);
    fclose(a);
    fclose(b);
  };
  const std::string keep = files[1] + ".keep";
  copy(files[1], keep);
  // Rank 1's file of another save in its place: refused (the manifest pins each file).
  copy(old_files[1], files[1]);
  CHECK(load_plain() == SSA_ERR_CORRUPT);
  std::vector<ssa_status> st = load_group(path, path);
  CHECK(st[0] == SSA_ERR_CORRUPT);
  CHECK(st[1] == SSA_ERR_CORRUPT);
  // Missing: refused.
  unlink(files[1].c_str());
  CHECK(load_plain() == SSA_ERR_IO);
  copy(keep, files[1]);
  unlink(keep.c_str());
  SSA_CHECK_OK(load_plain());
  // Ranks that load different snapshots, or one that cannot load its path: every rank gets an error.
  st = load_group(path, older);
  CHECK(st[0] == SSA_ERR_INVALID_ARGUMENT);
  CHECK(st[1] == SSA_ERR_INVALID_ARGUMENT);
  st = load_group(path, path + ".missing");
  CHECK(st[0] == SSA_ERR_IO);
  CHECK(st[1] == SSA_ERR_IO);
  st = load_group(path, path);
  CHECK(st[0] == SSA_OK);
  CHECK(st[1] == SSA_OK);
  // A flipped byte anywhere in the manifest: refused.
  FILE* m = fopen(path.c_str(), "rb");
  REQUIRE(m != nullptr);
  std::vector<unsigned char> bytes(1 << 16);
  bytes.resize(fread(bytes.data(), 1, bytes.size(), m));
  fclose(m);
  REQUIRE(bytes.size() > 64);
  for (size_t at : {size_t{9}, size_t{30}, size_t{70}, bytes.size() / 2, bytes.size() - 1}) {
    CAPTURE(at);
    std::vector<unsigned char> bad = bytes;
    bad[at] ^= 0x10;
    FILE* w = fopen(path.c_str(), "wb");
    fwrite(bad.data(), 1, bad.size(), w);
    fclose(w);
    const ssa_status s1 = load_plain();
    CHECK((s1 == SSA_ERR_CORRUPT || s1 == SSA_ERR_VERSION));
  }
  remove_set(path);
  remove_set(older);
}

TEST_CASE("process group: a manifest is checked value by value, not only by its checksum") {
  ssa::snap::Manifest m;
  m.set_id = 0x1234;
  m.shard_tokens = kShard;
  for (uint32_t r = 0; r < 3; ++r) {
    ssa::snap::RankFile f;
    f.name = ssa::snap::rank_file_name("x.ssa", m.set_id, r);
    f.file_id = 100 + r;
    f.generation = 1;
    f.file_length = 8192 + r;
    f.table_xxh3 = 7 * r;
    m.ranks.push_back(f);
  }
  const std::string good = ssa::snap::encode_manifest(m);
  absl::StatusOr<ssa::snap::Manifest> back = ssa::snap::decode_manifest(good, "m");
  REQUIRE(back.ok());
  CHECK(back->set_id == m.set_id);
  CHECK(back->ranks.size() == 3);
  CHECK(back->ranks[2].name == m.ranks[2].name);
  CHECK(back->ranks[1].file_length == m.ranks[1].file_length);
  // The checksum resealed after each change: only the value checks can refuse.
  auto reseal = [](std::string b) {
    const size_t n = b.size() - 8;
    ssa::snap::put_u64(reinterpret_cast<uint8_t*>(b.data()) + n, XXH3_64bits(b.data(), n));
    return b;
  };
  auto code = [&](const std::string& b) {
    absl::StatusOr<ssa::snap::Manifest> d = ssa::snap::decode_manifest(b, "m");
    return d.ok() ? SSA_OK : ssa::status_code(d.status());
  };
  CHECK(code(reseal(good)) == SSA_OK);
  auto with_u32 = [&](size_t at, uint32_t v) {
    std::string b = good;
    ssa::snap::put_u32(reinterpret_cast<uint8_t*>(b.data()) + at, v);
    return reseal(b);
  };
  auto with_u64 = [&](size_t at, uint64_t v) {
    std::string b = good;
    ssa::snap::put_u64(reinterpret_cast<uint8_t*>(b.data()) + at, v);
    return reseal(b);
  };
  CHECK(code(with_u32(8, 2)) == SSA_ERR_VERSION);
  CHECK(code(with_u32(12, 65)) == SSA_ERR_CORRUPT);   // header size
  CHECK(code(with_u32(16, 0)) == SSA_ERR_CORRUPT);    // no ranks
  CHECK(code(with_u32(16, 4)) == SSA_ERR_CORRUPT);    // more ranks than records
  CHECK(code(with_u32(16, 65)) == SSA_ERR_CORRUPT);
  CHECK(code(with_u32(20, 64)) == SSA_ERR_CORRUPT);   // record size
  CHECK(code(with_u64(24, 0)) == SSA_ERR_CORRUPT);    // set id 0
  CHECK(code(with_u64(32, 8191)) == SSA_ERR_CORRUPT); // shard_tokens
  CHECK(code(with_u64(32, 0)) == SSA_ERR_CORRUPT);
  const size_t rec1 = 64 + 320;
  CHECK(code(with_u64(rec1 + 0, 0)) == SSA_ERR_CORRUPT);     // file id 0
  CHECK(code(with_u64(rec1 + 8, 0)) == SSA_ERR_CORRUPT);     // generation 0
  CHECK(code(with_u64(rec1 + 16, 100)) == SSA_ERR_CORRUPT);  // shorter than a header area
  CHECK(code(with_u32(rec1 + 32, 0)) == SSA_ERR_CORRUPT);    // empty name
  CHECK(code(with_u32(rec1 + 32, 256)) == SSA_ERR_CORRUPT);  // longer than a file name
  CHECK(code(with_u32(rec1 + 32, 40)) == SSA_ERR_CORRUPT);   // a NUL inside the name
  std::string slash = good;
  slash[rec1 + 40 + 1] = '/';
  CHECK(code(reseal(slash)) == SSA_ERR_CORRUPT);
  std::string dots = with_u32(rec1 + 32, 2);
  for (size_t i = 0; i < 256; ++i) dots[rec1 + 40 + i] = i < 2 ? '.' : '\0';
  CHECK(code(reseal(dots)) == SSA_ERR_CORRUPT);
  std::string tail = good;
  tail[rec1 + 40 + 200] = 'x';  // past the name: padding must be zero
  CHECK(code(reseal(tail)) == SSA_ERR_CORRUPT);
  CHECK(code(good.substr(0, good.size() - 1)) == SSA_ERR_CORRUPT);
  CHECK(code(reseal(good + std::string(320, '\0'))) == SSA_ERR_CORRUPT);
  // Rank files of other saves to the same name, and nothing else.
  CHECK(ssa::snap::is_other_rank_file(ssa::snap::rank_file_name("x.ssa", 7, 3), "x.ssa", 8));
  CHECK_FALSE(ssa::snap::is_other_rank_file(ssa::snap::rank_file_name("x.ssa", 7, 3), "x.ssa", 7));
  CHECK_FALSE(ssa::snap::is_other_rank_file(ssa::snap::rank_file_name("y.ssa", 7, 3), "x.ssa", 8));
  CHECK_FALSE(ssa::snap::is_other_rank_file("x.ssa.tmp.host.12.0", "x.ssa", 8));
  CHECK_FALSE(ssa::snap::is_other_rank_file("x.ssa.00000000000000zz.rank1", "x.ssa", 8));
}

TEST_CASE("process group: a rank that stops answering gives the others SSA_ERR_IO, not a hang") {
  const StructuredFeed f(12000, SSA_DTYPE_F16, 24);
  const ssa_session_config cfg = group_config();
  ssa_status first = SSA_OK, second = SSA_OK;
  double waited_ms = 0;
  std::string message;
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link, 300);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 12000);
    if (r == 1) return;  // leaves the group
    const ssa_decode_params p = params(SSA_METHOD_SSA, 0, 20.0f);
    std::vector<uint8_t> out(f.q.size());
    const auto t0 = std::chrono::steady_clock::now();
    first = ssa_decode(s, 0, f.q.data(), out.data(), &p, nullptr);
    message = ssa_last_error_message();
    waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    second = ssa_decode(s, 0, f.q.data(), out.data(), &p, nullptr);  // out of step: refused at once
  });
  CHECK(first == SSA_ERR_IO);
  CHECK(second == SSA_ERR_IO);
  CHECK(message.find("timeout_ms 300") != std::string::npos);
  CHECK(waited_ms >= 250);
  CHECK(waited_ms < 20000);
}

TEST_CASE("process group: a rank that leaves before an index training or a save: SSA_ERR_IO, not a hang") {
  const StructuredFeed f(6000, SSA_DTYPE_F16, 27);
  const ssa_session_config cfg = group_config();  // trains at 4096 tokens
  ssa_status train = SSA_OK, save = SSA_OK;
  uint64_t length = 0;
  double waited_ms = 0;
  const std::string path = temp_path("left");
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link, 300);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 3000);
    if (r == 1) return;  // leaves the group
    const size_t row = 2 * 64 * 2;
    const auto t0 = std::chrono::steady_clock::now();
    train = ssa_session_append(s, 0, f.k.data() + 3000 * row, f.v.data() + 3000 * row, 3000);
    waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    length = ssa_session_length(s);
    save = ssa_session_save(s, path.c_str());  // out of step: refused at once
  });
  CHECK(train == SSA_ERR_IO);
  CHECK(length == 3000);  // the append that trains changed nothing
  CHECK(waited_ms >= 250);
  CHECK(waited_ms < 20000);
  CHECK(save == SSA_ERR_IO);
  CHECK(access(path.c_str(), F_OK) != 0);
  CHECK(rank_files(path).empty());
}

TEST_CASE("process group: rows only one rank was given refuse an append that trains, on every rank at once") {
  const size_t n = 12000;
  const StructuredFeed f(n, SSA_DTYPE_F16, 28);
  const ssa_session_config cfg = group_config();
  RuntimePtr plain = plain_runtime();
  ssa_session* ref = nullptr;
  SSA_CHECK_OK(ssa_session_create(plain.get(), &cfg, &ref));
  SessionPtr o(ref);
  f.append({ref}, 0, 0, n);
  const std::vector<Outcome> want = decode_grid(ref, f.q);
  std::vector<ssa_status> bad(2);
  std::vector<uint64_t> lengths(2);
  std::vector<double> waited(2);
  std::vector<std::vector<Outcome>> got(2);
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link, 20000);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 3000);
    const size_t row = 2 * 64 * 2;
    std::vector<uint8_t> k(f.k.begin() + 3000 * row, f.k.begin() + n * row);
    if (r == 1) {  // a NaN in rank 1's copy, in rank 0's shard
      k[100] = 0x00;
      k[101] = 0x7E;
    }
    const auto t0 = std::chrono::steady_clock::now();
    bad[r] = ssa_session_append(s, 0, k.data(), f.v.data() + 3000 * row, n - 3000);
    waited[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    lengths[r] = ssa_session_length(s);
    f.append({s}, 0, 3000, n);
    got[r] = decode_grid(s, f.q);
  });
  for (uint32_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(bad[r] == SSA_ERR_INVALID_ARGUMENT);
    CHECK(lengths[r] == 3000);
    CHECK(waited[r] < 10000);  // at the first exchange, not at the timeout
  }
  check_same_grid(want, got);
}

TEST_CASE("process group: ranks that disagree on q or on the layer get an error, and the group goes on") {
  const StructuredFeed f(12000, SSA_DTYPE_F16, 25);
  const ssa_session_config cfg = group_config();
  std::vector<ssa_status> bad_q(2), bad_len(2), after(2);
  std::vector<std::vector<uint8_t>> outs(2);
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    f.append({s}, 0, 0, 11000);
    const ssa_decode_params p = params(SSA_METHOD_SSA, 0, 20.0f);
    std::vector<uint8_t> q = f.q, out(f.q.size());
    if (r == 1) q[3] ^= 1;
    bad_q[r] = ssa_decode(s, 0, q.data(), out.data(), &p, nullptr);
    if (r == 1) f.append({s}, 0, 11000, 11001);
    bad_len[r] = ssa_decode(s, 0, f.q.data(), out.data(), &p, nullptr);
    if (r == 0) f.append({s}, 0, 11000, 11001);
    after[r] = ssa_decode(s, 0, f.q.data(), out.data(), &p, nullptr);
    outs[r] = out;
  });
  for (uint32_t r = 0; r < 2; ++r) {
    CHECK(bad_q[r] == SSA_ERR_INVALID_ARGUMENT);
    CHECK(bad_len[r] == SSA_ERR_INVALID_ARGUMENT);
    CHECK(after[r] == SSA_OK);
  }
  CHECK(outs[0] == outs[1]);
}

TEST_CASE("process group: bad tables and combinations are refused") {
  Transport t(2);
  RankLink link{&t, 0};
  auto create = [&](const ssa_collective& c, ssa_backend b = SSA_BACKEND_CPU, uint32_t n_devices = 0) {
    ssa_runtime_options o = runtime_options(b, 1);
    int32_t devices[] = {0, 1};
    if (n_devices != 0) {
      o.devices = devices;
      o.n_devices = n_devices;
    }
    o.collective = &c;
    ssa_runtime* rt = nullptr;
    const ssa_status st = ssa_runtime_create(&o, &rt);
    CHECK(rt == nullptr);
    return st;
  };
  ssa_collective c = table_of(&link);
  c.size = 0;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  c.rank = 2;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  c.size = 65;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  c.timeout_ms = 0;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  c.all_gather = nullptr;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  c.struct_size = 8;
  CHECK(create(c) == SSA_ERR_INVALID_ARGUMENT);
  c = table_of(&link);
  CHECK(create(c, SSA_BACKEND_CPU, 2) == SSA_ERR_UNSUPPORTED);
  {
    // A CUDA rank with tiers: refused before any device or exchange.
    ssa_runtime_options o = runtime_options(SSA_BACKEND_CUDA, 1);
    o.device_kv_budget = uint64_t{1} << 30;
    o.collective = &c;
    ssa_runtime* rt = nullptr;
    CHECK(ssa_runtime_create(&o, &rt) == SSA_ERR_UNSUPPORTED);
    CHECK(std::string(ssa_last_error_message()).find("device_kv_budget") != std::string::npos);
    CHECK(rt == nullptr);
  }
  CHECK(link.calls == 0);  // refused before any exchange
  // Ranks that disagree on shard_tokens, or number themselves wrongly.
  std::vector<ssa_status> st(2);
  run_ranks(2, [&](uint32_t r, RankLink& l) {
    ssa_collective tab = table_of(&l);
    ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 1);
    o.shard_tokens = r == 0 ? kShard : 2 * kShard;
    o.collective = &tab;
    ssa_runtime* rt = nullptr;
    st[r] = ssa_runtime_create(&o, &rt);
    ssa_runtime_destroy(rt);
  });
  CHECK(st[0] == SSA_ERR_INVALID_ARGUMENT);
  CHECK(st[1] == SSA_ERR_INVALID_ARGUMENT);
  run_ranks(2, [&](uint32_t r, RankLink& l) {
    ssa_collective tab = table_of(&l);
    tab.rank = 0;  // both say rank 0
    ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 1);
    o.collective = &tab;
    ssa_runtime* rt = nullptr;
    st[r] = ssa_runtime_create(&o, &rt);
    ssa_runtime_destroy(rt);
  });
  CHECK(st[0] == SSA_ERR_INVALID_ARGUMENT);
  CHECK(st[1] == SSA_ERR_INVALID_ARGUMENT);
}

TEST_CASE("process group: a query-aware proxy trains as unsharded; ranks that observed other queries are refused") {
  const size_t n = 12000;
  const StructuredFeed f(n, SSA_DTYPE_F16, 29);
  ssa_session_config cfg = group_config();
  cfg.proxy = SSA_PROXY_QPQ;
  // Two observed queries (the feed's, twice); rank 1's other ones differ in one
  // mantissa bit of one value.
  std::vector<uint8_t> shown = f.q, other;
  shown.insert(shown.end(), f.q.begin(), f.q.end());
  other = shown;
  other[f.q.size() + 5] ^= 1;
  RuntimePtr plain = plain_runtime();
  ssa_session* ref = nullptr;
  SSA_CHECK_OK(ssa_session_create(plain.get(), &cfg, &ref));
  SessionPtr o(ref);
  SSA_CHECK_OK(ssa_session_observe_queries(ref, 0, shown.data(), 2));
  f.append({ref}, 0, 0, n);
  const std::vector<Outcome> want = decode_grid(ref, f.q);
  std::vector<std::vector<Outcome>> got(2);
  std::vector<ssa_status> differ(2);
  std::vector<uint64_t> lengths(2);
  std::vector<std::string> said(2);
  run_ranks(2, [&](uint32_t r, RankLink& link) {
    RuntimePtr rt = group_runtime(&link);
    ssa_session* s = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &s));
    SessionPtr a(s);
    SSA_CHECK_OK(ssa_session_observe_queries(s, 0, shown.data(), 2));
    f.append({s}, 0, 0, n);  // trains: the same observed queries on both ranks
    got[r] = decode_grid(s, f.q);
    // A second session whose ranks observed different queries: its training append is refused.
    ssa_session* t = nullptr;
    SSA_CHECK_OK(ssa_session_create(rt.get(), &cfg, &t));
    SessionPtr b(t);
    SSA_CHECK_OK(ssa_session_observe_queries(t, 0, r == 1 ? other.data() : shown.data(), 2));
    f.append({t}, 0, 0, 3000);
    const size_t row = size_t{2} * 64 * 2;
    differ[r] = ssa_session_append(t, 0, f.k.data() + 3000 * row, f.v.data() + 3000 * row, n - 3000);
    said[r] = ssa_last_error_message();
    lengths[r] = ssa_session_length(t);
  });
  check_same_grid(want, got);
  for (uint32_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(differ[r] == SSA_ERR_INVALID_ARGUMENT);
    CHECK(said[r].find("observed queries") != std::string::npos);
    CHECK(lengths[r] == 3000);
  }
}
