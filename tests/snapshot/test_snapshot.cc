// Snapshot save/checkpoint/load: exact round trips, incremental checkpoints,
// crash safety (SIGKILLed writers), injected I/O failures, and bad files.
#include <doctest/doctest.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <mutex>
#include <shared_mutex>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "alloc.h"
#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "snapshot/record.h"
#include "support/snapshot_helpers.h"
#include "support/snapshot_load.h"

using namespace ssa;
using namespace ssa::test;

namespace {

ssa_status load_status(ssa_runtime* rt, const std::string& path, uint32_t flags,
                       std::string* msg = nullptr) {
  absl::StatusOr<std::unique_ptr<ssa_session>> s = snapshot_load(rt, path.c_str(), flags);
  if (msg) *msg = std::string(s.status().message());
  return status_code(s.status());
}

void check_restores(ssa_runtime* rt, ssa_session& orig, const std::string& path) {
  const std::vector<uint8_t> want = decode_fingerprint(orig, 99);
  for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP, SSA_LOAD_MMAP | SSA_LOAD_VERIFY}) {
    CAPTURE(flags);
    std::unique_ptr<ssa_session> back = load_ok(rt, path, flags);
    REQUIRE(back);
    CHECK(store_diff(orig, *back) == "");
    CHECK(decode_fingerprint(*back, 99) == want);
  }
}

// Rewrites a snapshot's table/superblock after test edits so its checksums match.
struct Rewriter {
  std::vector<uint8_t> bytes;
  snap::Superblock sb;
  std::vector<snap::SectionEntry> entries;

  explicit Rewriter(std::vector<uint8_t> b) : bytes(std::move(b)) {
    const uint8_t* p = bytes.data();
    sb.generation = snap::get_u64(p + snap::kSbGenerationOff);
    sb.table_offset = snap::get_u64(p + snap::kSbTableOffsetOff);
    sb.table_length = snap::get_u64(p + snap::kSbTableLengthOff);
    sb.file_length = snap::get_u64(p + snap::kSbFileLengthOff);
    sb.file_id = snap::get_u64(p + snap::kSbFileIdOff);
    const uint32_t n = snap::get_u32(p + sb.table_offset + 8);
    for (uint32_t i = 0; i < n; ++i)
      entries.push_back(snap::decode_entry(p + sb.table_offset + 64 + 64 * i));
  }
  snap::SectionEntry* find(snap::SectionKind k) {
    for (auto& e : entries)
      if (e.kind == static_cast<uint32_t>(k)) return &e;
    return nullptr;
  }
  void rehash_section(snap::SectionEntry& e) { e.xxh3 = XXH3_64bits(bytes.data() + e.offset, e.length); }
  std::vector<uint8_t> finish() {
    const std::string t = snap::encode_table(entries, sb.generation, sb.file_id);
    if (sb.table_offset + t.size() > bytes.size()) bytes.resize(sb.table_offset + t.size());
    memcpy(bytes.data() + sb.table_offset, t.data(), t.size());
    sb.table_length = t.size();
    sb.table_xxh3 = XXH3_64bits(t.data(), t.size());
    sb.slot = 0;
    sb.file_length = std::max<uint64_t>(sb.file_length, sb.table_offset + t.size());
    snap::encode_superblock(sb, bytes.data());
    return bytes;
  }
};

}  // namespace

TEST_CASE("full save round trip is exact for plain, verified and mapped loads") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/s.snap";
  ssa_session_config cfg = small_config();
  auto s = make_session(rt.get(), cfg, 203, 1);  // 203: a partial last page
  REQUIRE(s);
  {
    std::shared_lock l(s->mu);
    REQUIRE(s->layers[0].codebooks != nullptr);  // index trained: codes are saved too
  }
  REQUIRE(session_set_metadata(*s, "agent-42 state", 14).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  check_restores(rt.get(), *s, path);
  CHECK(list_dir(dir) == std::vector<std::string>{"s.snap"});  // no temp file left

  // A restore never retrains: the codebooks are the saved ones, the same objects' bytes.
  auto back = load_ok(rt.get(), path, 0);
  REQUIRE(back);
  char meta[32];
  size_t n = 0;
  REQUIRE(session_get_metadata(*back, meta, sizeof meta, &n).ok());
  CHECK(std::string(meta, n) == "agent-42 state");

  // Layers of different lengths and an empty session both round-trip.
  auto u = make_session(rt.get(), cfg, 0, 2);
  REQUIRE(u);
  REQUIRE(snapshot_save(*u, path.c_str()).ok());
  check_restores(rt.get(), *u, path);
  std::mt19937_64 rng(3);
  REQUIRE(append_random(*u, 1, 37, rng).ok());
  REQUIRE(snapshot_save(*u, path.c_str()).ok());
  check_restores(rt.get(), *u, path);
}

TEST_CASE("all dtypes and page sizes round trip") {
  auto rt = make_runtime();
  const std::string path = temp_dir() + "/d.snap";
  for (ssa_dtype dt : {SSA_DTYPE_F32, SSA_DTYPE_F16, SSA_DTYPE_BF16}) {
    for (uint32_t pt : {16u, 64u}) {
      ssa_session_config cfg = small_config();
      cfg.kv_dtype = dt;
      cfg.page_tokens = pt;
      auto s = make_session(rt.get(), cfg, 150, 10 + pt + dt);
      REQUIRE(s);
      REQUIRE(snapshot_save(*s, path.c_str()).ok());
      check_restores(rt.get(), *s, path);
    }
  }
}

TEST_CASE("checkpoints append only what changed and restore exactly") {
  auto rt = make_runtime();
  const std::string path = temp_dir() + "/c.snap";
  ssa_session_config cfg = small_config();
  cfg.index_regrow_factor = 0.0f;  // retraining only when asked
  auto s = make_session(rt.get(), cfg, 200, 4);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  std::mt19937_64 rng(5);
  const size_t kv_page = s->layout.kv_page_bytes();

  auto info = [&]() {
    ssa_snapshot_info i{};
    i.struct_size = sizeof i;
    REQUIRE(snapshot_inspect(path.c_str(), &i).ok());
    return i;
  };
  CHECK(info().generation == 1);

  SUBCASE("growth") {
    const uint64_t before = file_size(path);
    REQUIRE(append_all_layers(*s, 40, rng).ok());  // 200 -> 240 tokens: pages 12..14 change
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    const uint64_t grown = file_size(path) - before;
    // Per layer the 40 new rows of K/V and codes (8 of them completing page 12, a
    // row run; pages 13 and 14 a page run), plus alignment, layers and the table.
    const uint64_t new_rows = 2 * 40 * (kv_page + s->layout.code_page_bytes()) / s->layout.page_tokens;
    CHECK(grown >= new_rows);
    CHECK(grown <= new_rows + 2 * 4096 + 16384);
    CHECK(info().generation == 2);
    check_restores(rt.get(), *s, path);
    // Nothing changed: still a valid commit, a few hundred bytes.
    const uint64_t before2 = file_size(path);
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    CHECK(file_size(path) - before2 < 8192);
    check_restores(rt.get(), *s, path);
  }
  SUBCASE("truncate then append rewrites a page that was full") {
    REQUIRE(session_truncate(*s, 100).ok());  // page 6 becomes partial
    REQUIRE(append_all_layers(*s, 30, rng).ok());
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    check_restores(rt.get(), *s, path);
    // Shrinking alone also commits.
    REQUIRE(session_truncate(*s, 50).ok());
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    check_restores(rt.get(), *s, path);
  }
  SUBCASE("retrained codebooks and new metadata") {
    REQUIRE(session_update_index(*s).ok());
    REQUIRE(session_set_metadata(*s, "v2", 2).ok());
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    check_restores(rt.get(), *s, path);
    REQUIRE(session_set_metadata(*s, nullptr, 0).ok());
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    check_restores(rt.get(), *s, path);
  }
  SUBCASE("a fork checkpoints its own changes") {
    REQUIRE(session_set_metadata(*s, "parent", 6).ok());
    absl::StatusOr<std::unique_ptr<ssa_session>> f = session_fork(*s);
    REQUIRE(f.ok());
    char meta[8];
    size_t n = 0;
    REQUIRE(session_get_metadata(**f, meta, sizeof meta, &n).ok());
    CHECK(std::string(meta, n) == "parent");  // a fork carries the metadata
    REQUIRE(append_all_layers(**f, 20, rng).ok());
    REQUIRE(snapshot_checkpoint(**f, path.c_str()).ok());  // not its file: full save
    CHECK(info().generation == 1);
    check_restores(rt.get(), **f, path);
    // The original's record no longer matches the file: it falls back to a full save.
    REQUIRE(append_all_layers(*s, 5, rng).ok());
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    CHECK(info().generation == 1);
    check_restores(rt.get(), *s, path);
  }
  SUBCASE("a loaded session checkpoints incrementally into its own file") {
    for (uint32_t flags : {0u, SSA_LOAD_MMAP}) {
      auto back = load_ok(rt.get(), path, flags);
      REQUIRE(back);
      const uint64_t gen = info().generation, before = file_size(path);
      REQUIRE(append_all_layers(*back, 16, rng).ok());
      REQUIRE(snapshot_checkpoint(*back, path.c_str()).ok());
      CHECK(info().generation == gen + 1);
      CHECK(file_size(path) - before < 2 * 3 * (kv_page + 4096) + 16384);
      check_restores(rt.get(), *back, path);
      // A mapped session's pages copied into a full save are verified first.
      const std::string other = path + ".copy";
      REQUIRE(snapshot_save(*back, other.c_str()).ok());
      check_restores(rt.get(), *back, other);
    }
  }
  SUBCASE("many checkpoints stay bounded in size") {
    for (int i = 0; i < 30; ++i) {
      REQUIRE(append_all_layers(*s, 7, rng).ok());
      if (i % 10 == 9) REQUIRE(session_update_index(*s).ok());
      REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    }
    check_restores(rt.get(), *s, path);
    const ssa_snapshot_info i = info();
    CHECK(i.generation > 1);
    CHECK(i.live_bytes <= i.file_bytes);
  }
}

TEST_CASE("inspect and the expected-shape check") {
  auto rt = make_runtime();
  const std::string path = temp_dir() + "/i.snap";
  ssa_session_config cfg = small_config(0xABCDEF);
  auto s = make_session(rt.get(), cfg, 70, 6);
  REQUIRE(s);
  std::mt19937_64 rng(1);
  REQUIRE(append_random(*s, 1, 20, rng).ok());
  REQUIRE(session_set_metadata(*s, "0123456789", 10).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());

  ssa_snapshot_info i{};
  i.struct_size = sizeof i;
  REQUIRE(snapshot_inspect(path.c_str(), &i).ok());
  CHECK(i.format_version == snap::kFormatVersion);
  CHECK(i.n_layers == 2);
  CHECK(i.n_q_heads == 4);
  CHECK(i.n_kv_heads == 2);
  CHECK(i.head_dim == 64);
  CHECK(i.kv_dtype == SSA_DTYPE_F16);
  CHECK(i.pq_subspaces == 16);
  CHECK(i.pq_centroids == 16);
  CHECK(i.page_tokens == 16);
  CHECK(i.model_fingerprint == 0xABCDEF);
  CHECK(i.length == 70);
  CHECK(i.max_layer_length == 90);
  CHECK(i.indexed_layers == 2);
  CHECK(i.metadata_bytes == 10);
  CHECK(i.file_bytes == file_size(path));
  CHECK(i.generation == 1);

  // An older caller's smaller struct gets only its fields.
  ssa_snapshot_info small;
  memset(&small, 0xCC, sizeof small);
  small.struct_size = offsetof(ssa_snapshot_info, n_sections);
  REQUIRE(snapshot_inspect(path.c_str(), &small).ok());
  CHECK(small.generation == 1);
  CHECK(small.n_layers == 0xCCCCCCCCu);
  small.struct_size = 4;
  CHECK(status_code(snapshot_inspect(path.c_str(), &small)) == SSA_ERR_INVALID_ARGUMENT);

  CHECK(snapshot_load_checked(rt.get(), path.c_str(), 0, &cfg).ok());
  ssa_session_config other = cfg;
  other.model_fingerprint = 1;
  absl::StatusOr<std::unique_ptr<ssa_session>> r =
      snapshot_load_checked(rt.get(), path.c_str(), 0, &other);
  CHECK(status_code(r.status()) == SSA_ERR_MISMATCH);
  CHECK(std::string(r.status().message()).find("fingerprint") != std::string::npos);
  other = cfg;
  other.head_dim = 128;
  r = snapshot_load_checked(rt.get(), path.c_str(), 0, &other);
  CHECK(status_code(r.status()) == SSA_ERR_MISMATCH);
  CHECK(std::string(r.status().message()).find("head_dim") != std::string::npos);
  other = cfg;
  other.page_tokens = 256;  // a storage setting, not checked
  CHECK(snapshot_load_checked(rt.get(), path.c_str(), 0, &other).ok());
}

TEST_CASE("bad files give the right status and never a session") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/b.snap", bad = dir + "/bad.snap";
  auto s = make_session(rt.get(), small_config(), 40, 7);  // small file, no index
  REQUIRE(s);
  REQUIRE(session_set_metadata(*s, "m", 1).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  const std::vector<uint8_t> good = read_file(path);
  REQUIRE(good.size() > 4096);
  std::string msg;

  SUBCASE("missing, directory, empty, garbage, wrong magic") {
    CHECK(load_status(rt.get(), dir + "/nope.snap", 0, &msg) == SSA_ERR_IO);
    CHECK(msg.find("nope.snap") != std::string::npos);
    CHECK(load_status(rt.get(), dir, 0, &msg) == SSA_ERR_IO);
    REQUIRE(write_file(bad, "", 0));
    CHECK(load_status(rt.get(), bad, 0, &msg) == SSA_ERR_CORRUPT);
    CHECK(msg.find("empty") != std::string::npos);
    std::mt19937_64 rng(8);
    std::vector<uint8_t> junk(10000);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    REQUIRE(write_file(bad, junk.data(), junk.size()));
    CHECK(load_status(rt.get(), bad, 0, &msg) == SSA_ERR_CORRUPT);
    CHECK(msg.find("magic") != std::string::npos);
    std::vector<uint8_t> m = good;
    m[1] = 'X';
    REQUIRE(write_file(bad, m.data(), m.size()));
    CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_CORRUPT);
  }
  SUBCASE("every truncation") {
    for (size_t n = 0; n < good.size(); n += (n < 4200 ? 1 : 61)) {
      REQUIRE(write_file(bad, good.data(), n));
      const ssa_status st = load_status(rt.get(), bad, 0, &msg);
      CHECK_MESSAGE(st == SSA_ERR_CORRUPT, "truncated to " << n << ": " << msg);
      CHECK(!msg.empty());
    }
  }
  SUBCASE("every byte flipped") {
    // Bytes covered by a checksum (live superblock, table, sections) must be
    // caught; flips elsewhere (padding, the unused slot) must leave the load exact.
    Rewriter rw(good);
    std::vector<bool> covered(good.size(), false);
    auto cover = [&](uint64_t off, uint64_t len) {
      for (uint64_t i = off; i < off + len; ++i) covered[i] = true;
    };
    cover(0, snap::kSuperblockBytes);
    cover(rw.sb.table_offset, rw.sb.table_length);
    for (const auto& e : rw.entries) cover(e.offset, e.length);
    // Every byte outside KV/code page runs; inside them every 97th (a page run is
    // one hash, so one flip per run already proves the check).
    std::vector<bool> in_pages(good.size(), false);
    for (const auto& e : rw.entries) {
      if (e.kind == uint32_t(snap::SectionKind::kKvPages) || e.kind == uint32_t(snap::SectionKind::kCodePages))
        for (uint64_t i = e.offset; i < e.offset + e.length; ++i) in_pages[i] = true;
    }
    int detected = 0, harmless = 0;
    for (size_t i = 0; i < good.size(); ++i) {
      if (in_pages[i] && i % 97 != 0) continue;
      std::vector<uint8_t> m = good;
      m[i] ^= static_cast<uint8_t>(1u << (i % 8));
      REQUIRE(write_file(bad, m.data(), m.size()));
      for (uint32_t flags : {0u, SSA_LOAD_VERIFY | SSA_LOAD_MMAP}) {
        if (flags != 0 && i % 5 != 0) continue;
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
        if (covered[i]) {
          CHECK_MESSAGE(!r.ok(), "flip at " << i << " not detected");
          if (!r.ok()) {
            const ssa_status st = status_code(r.status());
            CHECK_MESSAGE((st == SSA_ERR_CORRUPT || st == SSA_ERR_VERSION), "flip at " << i);
          }
          ++detected;
        } else {
          REQUIRE_MESSAGE(r.ok(), "flip at " << i << ": " << r.status().message());
          CHECK(store_diff(*s, **r) == "");
          ++harmless;
        }
      }
    }
    MESSAGE("byte flips detected: " << detected << ", in unchecked padding (load exact): " << harmless);
  }
  SUBCASE("future version, unknown required features and sections") {
    std::vector<uint8_t> m = good;
    snap::put_u32(m.data() + snap::kSbVersionOff, snap::kFormatVersion + 1);
    snap::put_u64(m.data() + 120, XXH3_64bits(m.data(), 120));
    REQUIRE(write_file(bad, m.data(), m.size()));
    CHECK(load_status(rt.get(), bad, 0, &msg) == SSA_ERR_VERSION);
    CHECK(msg.find("version") != std::string::npos);
    ssa_snapshot_info i{};
    i.struct_size = sizeof i;
    CHECK(status_code(snapshot_inspect(bad.c_str(), &i)) == SSA_ERR_VERSION);

    m = good;
    snap::put_u32(m.data() + snap::kSbFlagsOff, 1);
    snap::put_u64(m.data() + 120, XXH3_64bits(m.data(), 120));
    REQUIRE(write_file(bad, m.data(), m.size()));
    CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_VERSION);

    Rewriter rw(good);
    rw.entries.push_back(rw.entries.back());
    rw.entries.back().kind = 99;
    std::vector<uint8_t> withkind = rw.finish();
    REQUIRE(write_file(bad, withkind.data(), withkind.size()));
    CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_VERSION);
    Rewriter rw2(good);
    rw2.entries.push_back(rw2.entries.back());
    rw2.entries.back().kind = 99;
    rw2.entries.back().flags = snap::kSectionOptional;  // optional: skipped
    std::vector<uint8_t> optional = rw2.finish();
    REQUIRE(write_file(bad, optional.data(), optional.size()));
    auto back = load_ok(rt.get(), bad, SSA_LOAD_VERIFY);
    REQUIRE(back);
    CHECK(store_diff(*s, *back) == "");
  }
  SUBCASE("absurd lengths with valid checksums") {
    uint64_t alloc_before = alloc_calls_made();
    // A layer claiming 2^62 tokens.
    {
      Rewriter rw(good);
      snap::SectionEntry* le = rw.find(snap::SectionKind::kLayers);
      REQUIRE(le);
      snap::put_u64(rw.bytes.data() + le->offset, uint64_t{1} << 62);
      rw.rehash_section(*le);
      std::vector<uint8_t> m = rw.finish();
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0, &msg) == SSA_ERR_CORRUPT);
      CHECK(msg.find("tokens") != std::string::npos);
    }
    // A section running past the table / the end of the file.
    for (uint64_t len : {uint64_t{1} << 40, ~uint64_t{0} - 100}) {
      Rewriter rw(good);
      rw.find(snap::SectionKind::kMetadata)->length = len;
      std::vector<uint8_t> m = rw.finish();
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_CORRUPT);
    }
    // A page run whose count disagrees with its length, or overflowing first page.
    {
      Rewriter rw(good);
      rw.find(snap::SectionKind::kKvPages)->count = uint64_t{1} << 60;
      std::vector<uint8_t> m = rw.finish();
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_CORRUPT);
      Rewriter rw2(good);
      rw2.find(snap::SectionKind::kKvPages)->first = ~uint64_t{0};
      m = rw2.finish();
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_CORRUPT);
    }
    // A table length far beyond the file.
    {
      std::vector<uint8_t> m = good;
      snap::put_u64(m.data() + snap::kSbTableLengthOff, uint64_t{1} << 50);
      snap::put_u64(m.data() + 120, XXH3_64bits(m.data(), 120));
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0) == SSA_ERR_CORRUPT);
    }
    // A config with an impossible shape.
    {
      Rewriter rw(good);
      snap::SectionEntry* ce = rw.find(snap::SectionKind::kConfig);
      snap::put_u32(rw.bytes.data() + ce->offset + 12, 7);  // head_dim 7
      rw.rehash_section(*ce);
      std::vector<uint8_t> m = rw.finish();
      REQUIRE(write_file(bad, m.data(), m.size()));
      CHECK(load_status(rt.get(), bad, 0, &msg) == SSA_ERR_CORRUPT);
      CHECK(msg.find("head_dim") != std::string::npos);
    }
    // None of these allocated pages.
    CHECK(alloc_calls_made() - alloc_before == 0);
  }
  SUBCASE("unwritable places give SSA_ERR_IO") {
    absl::Status st = snapshot_save(*s, (dir + "/no/such/dir/x.snap").c_str());
    CHECK(status_code(st) == SSA_ERR_IO);
    CHECK(std::string(st.message()).find("no/such/dir") != std::string::npos);
    CHECK(status_code(snapshot_save(*s, "/proc/ssa_snapshot_test.snap")) == SSA_ERR_IO);
    CHECK(status_code(snapshot_checkpoint(*s, "/proc/ssa_snapshot_test.snap")) == SSA_ERR_IO);
    CHECK(status_code(snapshot_save(*s, (path + "/x").c_str())) == SSA_ERR_IO);  // parent is a file
    if (geteuid() != 0) {
      const std::string ro = dir + "/ro";
      REQUIRE(mkdir(ro.c_str(), 0555) == 0);
      CHECK(status_code(snapshot_save(*s, (ro + "/x.snap").c_str())) == SSA_ERR_IO);
    }
    CHECK(status_code(snapshot_save(*s, "")) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(status_code(snapshot_load(rt.get(), path.c_str(), 0x80).status()) ==
          SSA_ERR_INVALID_ARGUMENT);
  }
}

// ---- injected I/O failures ---------------------------------------------------

namespace {

struct Injector {
  enum Kind { kOpen, kWrite, kFsync, kRename, kCount };
  static inline std::atomic<uint64_t> calls[kCount];
  static inline std::atomic<int> fail_kind{-1};
  static inline std::atomic<uint64_t> fail_at{0};
  static inline std::atomic<bool> short_writes{false};

  static bool hit(Kind k) {
    const uint64_t n = ++calls[k];
    return fail_kind.load() == k && n == fail_at.load();
  }
  static int open(const char* p, int f, mode_t m) {
    if (hit(kOpen)) return errno = EACCES, -1;
    return snap::posix_file_io().open(p, f, m);
  }
  static ssize_t pwrite(int fd, const void* b, size_t n, off_t o) {
    if (hit(kWrite)) return errno = ENOSPC, -1;
    if (short_writes && n > 1) n /= 2;
    return snap::posix_file_io().pwrite(fd, b, n, o);
  }
  static int fsync(int fd) {
    if (hit(kFsync)) return errno = EIO, -1;
    return snap::posix_file_io().fsync(fd);
  }
  static int rename(const char* a, const char* b) {
    if (hit(kRename)) return errno = EXDEV, -1;
    return snap::posix_file_io().rename(a, b);
  }
  static void reset(int kind, uint64_t at) {
    for (auto& c : calls) c = 0;
    fail_kind = kind;
    fail_at = at;
  }
  static snap::FileIo table() {
    snap::FileIo t = snap::posix_file_io();
    t.open = open;
    t.pwrite = pwrite;
    t.fsync = fsync;
    t.rename = rename;
    return t;
  }
};

struct ScopedIo {
  snap::FileIo t = Injector::table();
  ScopedIo() { snap::set_file_io(&t); }
  ~ScopedIo() { snap::set_file_io(nullptr); }
};

}  // namespace

// Runs save and checkpoint with the n-th call of each kind failing, for every n;
// returns the number of fault points exercised.
int fault_loops(const ssa_session_config& cfg) {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/f.snap";
  auto s = make_session(rt.get(), cfg, 150, 11);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  auto prev = load_ok(rt.get(), path, 0);  // the state on disk
  REQUIRE(prev);
  std::mt19937_64 rng(12);
  REQUIRE(append_all_layers(*s, 60, rng).ok());  // the partial last page changes, maybe more
  REQUIRE(session_set_metadata(*s, "after", 5).ok());
  const std::vector<uint8_t> disk_before = read_file(path);
  std::shared_ptr<SnapshotRecord> record_before;
  {
    std::lock_guard l(s->snapshot_mu);
    record_before = s->snapshot->record;
  }
  auto rewind = [&]() {  // back to "path holds prev, s last wrote prev there"
    REQUIRE(write_file(path, disk_before.data(), disk_before.size()));  // same inode
    std::lock_guard l(s->snapshot_mu);
    s->snapshot->record = record_before;
  };
  static const char* kKindName[] = {"open", "write", "fsync", "rename"};

  ScopedIo io;
  int fault_points = 0;
  for (int op = 0; op < 2; ++op) {
    const std::string op_name = op == 0 ? "checkpoint" : "save";
    for (int kind = 0; kind < Injector::kCount; ++kind) {
      for (uint64_t n = 1;; ++n) {
        CAPTURE(op_name);
        const std::string kind_name = kKindName[kind];
        CAPTURE(kind_name);
        CAPTURE(n);
        rewind();
        Injector::reset(kind, n);
        const absl::Status st =
            op == 0 ? snapshot_checkpoint(*s, path.c_str()) : snapshot_save(*s, path.c_str());
        const bool injected = Injector::calls[kind] >= n;
        const uint64_t renames = Injector::calls[Injector::kRename];
        Injector::reset(-1, 0);
        if (!injected) {
          // This kind has fewer than n calls: the run was clean and must commit.
          CHECK(st.ok());
          auto now = load_ok(rt.get(), path, SSA_LOAD_VERIFY);
          if (now) CHECK(store_diff(*s, *now) == "");
          break;
        }
        ++fault_points;
        CHECK(status_code(st) == SSA_ERR_IO);
        CHECK(!st.message().empty());
        auto after = load_ok(rt.get(), path, SSA_LOAD_VERIFY);
        if (!after) return fault_points;
        const bool old_state = store_diff(*prev, *after) == "";
        // Only a failure after the rename (opening or fsyncing the directory) may
        // leave the new file in place.
        const bool after_rename = op == 1 && kind != Injector::kRename && renames > 0;
        if (after_rename) {
          CHECK((old_state || store_diff(*s, *after) == ""));
        } else {
          CHECK(old_state);
          if (op == 1) CHECK(read_file(path) == disk_before);  // untouched
        }
        // No temporary file is left behind.
        CHECK(list_dir(dir) == std::vector<std::string>{"f.snap"});
      }
    }
  }
  // Short writes are retried, not failures.
  rewind();
  Injector::short_writes = true;
  CHECK(snapshot_checkpoint(*s, path.c_str()).ok());
  CHECK(snapshot_save(*s, path.c_str()).ok());
  Injector::short_writes = false;
  auto last = load_ok(rt.get(), path, SSA_LOAD_VERIFY);
  if (last) CHECK(store_diff(*s, *last) == "");
  return fault_points;
}

TEST_CASE("every failing write, fsync, rename and open leaves the previous snapshot intact") {
  // Small pages go through the write buffer; 2 MiB pages are written directly,
  // one write per page, so each page write fails in turn.
  ssa_session_config big = small_config();
  big.n_kv_heads = 8;
  big.n_q_heads = 8;
  big.head_dim = 256;
  big.page_tokens = 256;
  big.pq_subspaces = 16;
  big.index_min_tokens = 32;
  const int points = fault_loops(small_config()) + fault_loops(big);
  MESSAGE("injected I/O fault points: " << points);
  CHECK(points >= 20);
}

TEST_CASE("an allocation failing anywhere in a load gives SSA_ERR_OUT_OF_MEMORY and no session") {
  auto rt = make_runtime();
  const std::string path = temp_dir() + "/a.snap";
  auto s = make_session(rt.get(), small_config(), 120, 13);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  int points = 0;
  for (uint64_t n = 1;; ++n) {
    set_alloc_failure_countdown(n, false);
    const uint64_t before = alloc_calls_made();
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
    const bool reached = alloc_calls_made() - before >= n;
    set_alloc_failure_countdown(0, false);
    if (!reached) {
      REQUIRE(r.ok());
      CHECK(store_diff(*s, **r) == "");
      break;
    }
    ++points;
    CHECK(status_code(r.status()) == SSA_ERR_OUT_OF_MEMORY);
  }
  CHECK(points >= 16);
}

// ---- crash safety: a writer killed at random points -----------------------------

namespace {

// Digest of a session's visible state; equal digests = byte-identical stores.
uint64_t digest(const ssa_session& s) {
  std::shared_lock l(s.mu);
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, s.metadata.data(), s.metadata.size());
  for (const LayerStore& L : s.layers) {
    XXH3_64bits_update(h, &L.n_tokens, 8);
    XXH3_64bits_update(h, &L.trained_at_tokens, 8);
    const uint64_t pages = s.layout.pages_for(L.n_tokens);
    for (uint64_t p = 0; p < pages; ++p) {
      const uint32_t valid = valid_in_page(s.layout, L.n_tokens, p);
      for_each_visible(s.layout, true, valid, [&](size_t off, size_t len) {
        XXH3_64bits_update(h, L.kv_pages[p]->data() + off, len);
      });
      if (!L.codebooks) continue;
      for_each_visible(s.layout, false, valid, [&](size_t off, size_t len) {
        XXH3_64bits_update(h, L.code_pages[p]->data() + off, len);
      });
    }
    if (L.codebooks)
      XXH3_64bits_update(h, L.codebooks->data.data(), L.codebooks->data.size() * sizeof(float));
  }
  const uint64_t d = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return d;
}

// Step i of the writer's history: a deterministic change, then a save or checkpoint.
uint64_t session_length_locked_for_test(ssa_session& s) {
  std::shared_lock l(s.mu);
  return session_length_locked(s);
}

absl::Status writer_step(ssa_session& s, int i, const std::string& path) {
  std::mt19937_64 rng(1000 + i);
  SSA_RETURN_IF_ERROR(append_all_layers(s, 24 + i % 5, rng));
  if (i % 4 == 2) SSA_RETURN_IF_ERROR(session_truncate(s, session_length_locked_for_test(s) - 9));
  const std::string meta = "step " + std::to_string(i);
  SSA_RETURN_IF_ERROR(session_set_metadata(s, meta.data(), meta.size()));
  return i % 3 == 0 ? snapshot_save(s, path.c_str()) : snapshot_checkpoint(s, path.c_str());
}

}  // namespace

TEST_CASE("a writer killed at random points leaves the old or a new snapshot") {
  auto rt = make_runtime();  // one thread: nothing but the caller runs at fork()
  const std::string dir = temp_dir(), path = dir + "/k.snap";
  constexpr int kSteps = 12;
  ssa_session_config cfg = small_config();
  cfg.index_regrow_factor = 1.5f;  // retrains (new codebooks, all codes) along the way

  // The states the file may hold: the initial save, then after each step.
  std::set<uint64_t> states;
  std::vector<uint64_t> ordered;
  {
    auto s = make_session(rt.get(), cfg, 100, 21);
    REQUIRE(s);
    const std::string scratch = dir + "/scratch.snap";
    ordered.push_back(digest(*s));
    for (int i = 0; i < kSteps; ++i) {
      REQUIRE(writer_step(*s, i, scratch).ok());
      ordered.push_back(digest(*s));
    }
    states.insert(ordered.begin(), ordered.end());
    REQUIRE(states.size() == ordered.size());
  }
  // How long a full history takes, to spread the kills over it.
  auto timed = make_session(rt.get(), cfg, 100, 21);
  REQUIRE(snapshot_save(*timed, path.c_str()).ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) REQUIRE(writer_step(*timed, i, path).ok());
  const double span_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  {
    // The history's checkpoints hold row runs of both kinds, so kills land in them too.
    Rewriter r(read_file(path));
    int kv_rows = 0, code_rows = 0;
    for (const auto& e : r.entries) {
      kv_rows += e.kind == static_cast<uint32_t>(snap::SectionKind::kKvRows);
      code_rows += e.kind == static_cast<uint32_t>(snap::SectionKind::kCodeRows);
    }
    CHECK(kv_rows > 0);
    CHECK(code_rows > 0);
  }

  std::mt19937_64 rng(77);
  std::set<size_t> seen;
  constexpr int kKills = 50;
  for (int k = 0; k < kKills; ++k) {
    auto s = make_session(rt.get(), cfg, 100, 21);
    REQUIRE(s);
    REQUIRE(snapshot_save(*s, path.c_str()).ok());
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int i = 0; i < kSteps; ++i) {
        if (!writer_step(*s, i, path).ok()) _exit(3);
      }
      _exit(0);
    }
    const auto delay = std::chrono::microseconds(
        static_cast<int64_t>(std::uniform_real_distribution<double>(0, span_us * 1.1)(rng)));
    std::this_thread::sleep_for(delay);
    kill(pid, SIGKILL);
    int wstatus = 0;
    REQUIRE(waitpid(pid, &wstatus, 0) == pid);
    CHECK_MESSAGE(!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 3), "the writer failed");
    for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP}) {
      auto back = load_ok(rt.get(), path, flags);
      REQUIRE(back);
      const uint64_t d = digest(*back);
      const auto it = std::find(ordered.begin(), ordered.end(), d);
      CHECK_MESSAGE(it != ordered.end(), "kill " << k << ": the file holds none of the states");
      if (it != ordered.end()) seen.insert(static_cast<size_t>(it - ordered.begin()));
    }
    // Decodes after the restore equal those of the matching state, rebuilt here.
    if (k % 10 == 0) {
      auto back = load_ok(rt.get(), path, 0);
      REQUIRE(back);
      const size_t idx = static_cast<size_t>(
          std::find(ordered.begin(), ordered.end(), digest(*back)) - ordered.begin());
      auto replay = make_session(rt.get(), cfg, 100, 21);
      for (size_t i = 0; i < idx; ++i) REQUIRE(writer_step(*replay, static_cast<int>(i), dir + "/replay.snap").ok());
      CHECK(decode_fingerprint(*replay, 5) == decode_fingerprint(*back, 5));
    }
  }
  MESSAGE("kills: " << kKills << ", distinct states found after a kill: " << seen.size() << " of "
                    << ordered.size());
  CHECK(seen.size() >= 3);  // the kills did land at different points
}

TEST_CASE("the fuzz corpus replays through the loader without harm") {
  auto rt = make_runtime();
  const std::string dir = SSA_FUZZ_CORPUS_DIR;
  const std::vector<std::string> files = list_dir(dir);
  REQUIRE(files.size() >= 4);
  int ok = 0, rejected = 0;
  for (const std::string& f : files) {
    for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP}) {
      absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), (dir + "/" + f).c_str(), flags);
      if (r.ok()) {
        ++ok;
        (void)decode_fingerprint(**r, 1);
      } else {
        ++rejected;
        CHECK(!r.status().message().empty());
        const ssa_status st = status_code(r.status());
        CHECK((st == SSA_ERR_CORRUPT || st == SSA_ERR_VERSION));
      }
    }
  }
  MESSAGE("corpus files: " << files.size() << ", loads ok: " << ok << ", rejected: " << rejected);
  CHECK(ok > 0);
  CHECK(rejected > 0);
}

TEST_CASE("checkpoints run beside decodes and appends and capture committed states") {
  auto rt = make_runtime(2);
  const std::string path = temp_dir() + "/t.snap";
  ssa_session_config cfg = small_config();
  cfg.n_layers = 1;
  auto s = make_session(rt.get(), cfg, 96, 31);
  REQUIRE(s);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread decoder([&]() {
    std::vector<uint16_t> q(size_t{cfg.n_q_heads} * cfg.head_dim, f32_to_f16(0.25f)), out(q.size());
    ssa_decode_params p{};
    p.struct_size = sizeof p;
    p.method = SSA_METHOD_DENSE;
    p.sparsity = 1.0f;
    p.pi_min = 1e-4f;
    while (!stop) {
      if (!decode(*s, 0, q.data(), out.data(), p, nullptr).ok()) ++failures;
    }
  });
  std::thread appender([&]() {
    std::mt19937_64 rng(32);
    for (int i = 0; i < 40 && !stop; ++i) {
      if (!append_random(*s, 0, 8, rng).ok()) ++failures;
    }
  });
  std::set<uint64_t> lengths;
  for (int i = 0; i < 15; ++i) {
    REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
    auto back = load_ok(rt.get(), path, SSA_LOAD_VERIFY);
    REQUIRE(back);
    const uint64_t n = ssa::test::session_length(*back);
    CHECK((n - 96) % 8 == 0);  // whole appends only
    lengths.insert(n);
  }
  appender.join();
  stop = true;
  decoder.join();
  CHECK(failures == 0);
  REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
  auto last = load_ok(rt.get(), path, 0);
  REQUIRE(last);
  CHECK(store_diff(*s, *last) == "");
  MESSAGE("distinct lengths captured while appending: " << lengths.size());
}
