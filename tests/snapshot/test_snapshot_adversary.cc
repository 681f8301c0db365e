// Crafted snapshot files whose checksums all match: every value the loader takes
// from a file is checked before it is trusted. A load either fails with a status,
// a message and no session, or yields a session that decodes in bounds with
// finite outputs.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <xxhash.h>

#include <functional>

#include "alloc.h"
#include "support/loaded_session_check.h"
#include "snapshot/content_check.h"
#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "support/snapshot_image.h"
#include "support/snapshot_helpers.h"

using namespace ssa;
using namespace ssa::test;

namespace {

constexpr uint32_t kAllFlags[] = {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP, SSA_LOAD_MMAP | SSA_LOAD_VERIFY};

// An indexed, checkpointed two-layer session (several generations, superseded
// runs, a partial last page) with 16 centroids, so most code bytes are invalid.
ssa_session_config adversary_config(ssa_dtype dt = SSA_DTYPE_F16) {
  ssa_session_config c = small_config(0xADu);
  c.kv_dtype = dt;
  c.n_kv_heads = 2;
  c.n_q_heads = 4;
  c.head_dim = 32;
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  c.index_min_tokens = 24;
  return c;
}

std::vector<uint8_t> checkpointed_file(ssa_runtime* rt, const std::string& path,
                                       ssa_dtype dt = SSA_DTYPE_F16) {
  auto s = make_session(rt, adversary_config(dt), 40, 5);
  REQUIRE(s);
  REQUIRE(session_set_metadata(*s, "meta", 4).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  std::mt19937_64 rng(6);
  REQUIRE(append_all_layers(*s, 13, rng).ok());
  REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
  return read_file(path);
}

struct Outcome {
  int rejected = 0, loaded = 0;
};

// Loads `bytes` with every flag combination; checks the contract of each result.
void load_all_ways(ssa_runtime* rt, const std::string& path, const std::vector<uint8_t>& bytes,
                   const std::string& what, Outcome* out) {
  REQUIRE(write_file(path, bytes.data(), bytes.size()));
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  const bool inspected = snapshot_inspect(path.c_str(), &info).ok();
  for (uint32_t flags : kAllFlags) {
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt, path.c_str(), flags);
    if (!r.ok()) {
      const ssa_status st = status_code(r.status());
      CHECK_MESSAGE((st == SSA_ERR_CORRUPT || st == SSA_ERR_VERSION), what << ", flags " << flags
                    << ": status " << st << " " << r.status().message());
      CHECK_MESSAGE(!r.status().message().empty(), what);
      ++out->rejected;
      continue;
    }
    ++out->loaded;
    CHECK_MESSAGE(inspected, what << ": load accepts what inspect rejects");
    // Mapped K/V are not checked at load without VERIFY (docs/SNAPSHOT_FORMAT.md).
    const bool finite = flags != SSA_LOAD_MMAP;
    const std::string bad = check_loaded_session(**r, finite);
    CHECK_MESSAGE(bad == "", what << ", flags " << flags << ": " << bad);
  }
}

std::vector<uint64_t> interesting(uint64_t cur, uint64_t file_size) {
  return {0, 1, 2, 7, 16, 17, 255, 256, 4095, 4096, 65536, 0x7fffffffull, 0x80000000ull,
          0xffffffffull, uint64_t{1} << 32, uint64_t{1} << 63, ~uint64_t{0}, ~uint64_t{0} - 1,
          cur - 1, cur + 1, cur * 2, cur + 64, cur + 4096, file_size, file_size - 64};
}

}  // namespace

TEST_CASE("every field of every section set to boundary values, checksums resealed") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/a.snap", bad = dir + "/bad.snap";
  const std::vector<uint8_t> good = checkpointed_file(rt.get(), path);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  Outcome o;
  int edits = 0;
  auto edit = [&](const std::string& what, const std::function<void(SnapshotImage&)>& fn) {
    SnapshotImage img = base;
    fn(img);
    img.seal();
    load_all_ways(rt.get(), bad, img.bytes, what, &o);
    ++edits;
  };
  // Section bodies: each 4-byte word of the config, layer records and codebook
  // header; u64 words where the format has them.
  for (size_t i = 0; i < base.entries.size(); ++i) {
    const snap::SectionEntry e = base.entries[i];
    size_t words = 0;
    if (e.kind == uint32_t(snap::SectionKind::kConfig)) words = snap::kConfigBytes / 4;
    if (e.kind == uint32_t(snap::SectionKind::kLayers)) words = e.length / 4;
    if (e.kind == uint32_t(snap::SectionKind::kCodebooks)) words = snap::kCodebooksHeaderBytes / 4;
    for (size_t w = 0; w < words; ++w) {
      const uint32_t cur = snap::get_u32(good.data() + e.offset + 4 * w);
      for (uint64_t v : interesting(cur, good.size())) {
        edit(std::string(snap::section_kind_name(e.kind)) + " word " + std::to_string(w) + " = " + std::to_string(uint32_t(v)),
             [&](SnapshotImage& img) {
               snap::put_u32(img.body(i) + 4 * w, static_cast<uint32_t>(v));
               img.rehash(i);
             });
      }
    }
  }
  // Table entries: every field.
  for (size_t i = 0; i < base.entries.size(); ++i) {
    const snap::SectionEntry e = base.entries[i];
    struct Field {
      const char* name;
      uint64_t snap::SectionEntry::*u64;
      uint32_t snap::SectionEntry::*u32;
    } fields[] = {{"kind", nullptr, &snap::SectionEntry::kind},
                  {"layer", nullptr, &snap::SectionEntry::layer},
                  {"offset", &snap::SectionEntry::offset, nullptr},
                  {"length", &snap::SectionEntry::length, nullptr},
                  {"alignment", nullptr, &snap::SectionEntry::alignment},
                  {"flags", nullptr, &snap::SectionEntry::flags},
                  {"first", &snap::SectionEntry::first, nullptr},
                  {"count", &snap::SectionEntry::count, nullptr}};
    for (const Field& f : fields) {
      const uint64_t cur = f.u64 ? e.*f.u64 : e.*f.u32;
      for (uint64_t v : interesting(cur, good.size())) {
        edit("entry " + std::to_string(i) + " " + f.name + " = " + std::to_string(v), [&](SnapshotImage& img) {
          if (f.u64) img.entries[i].*f.u64 = v;
          else img.entries[i].*f.u32 = static_cast<uint32_t>(v);
        });
      }
    }
  }
  // Superblock fields (the table is resealed for the generation it names).
  struct SbField {
    const char* name;
    uint64_t snap::Superblock::*u64;
    uint32_t snap::Superblock::*u32;
  } sb_fields[] = {{"generation", &snap::Superblock::generation, nullptr},
                   {"table_offset", &snap::Superblock::table_offset, nullptr},
                   {"file_length", &snap::Superblock::file_length, nullptr},
                   {"slot", nullptr, &snap::Superblock::slot},
                   {"flags", nullptr, &snap::Superblock::flags},
                   {"format_version", nullptr, &snap::Superblock::format_version}};
  for (const SbField& f : sb_fields) {
    const uint64_t cur = f.u64 ? base.sb.*f.u64 : base.sb.*f.u32;
    for (uint64_t v : interesting(cur, good.size())) {
      edit(std::string("superblock ") + f.name + " = " + std::to_string(v), [&](SnapshotImage& img) {
        if (f.u64) img.sb.*f.u64 = v;
        else img.sb.*f.u32 = static_cast<uint32_t>(v);
      });
    }
  }
  // Entries duplicated, dropped and swapped.
  for (size_t i = 0; i < base.entries.size(); ++i) {
    edit("entry " + std::to_string(i) + " dropped", [&](SnapshotImage& img) {
      img.entries.erase(img.entries.begin() + static_cast<long>(i));
    });
    edit("entry " + std::to_string(i) + " duplicated", [&](SnapshotImage& img) {
      img.entries.push_back(img.entries[i]);
    });
    edit("entry " + std::to_string(i) + " swapped with the last", [&](SnapshotImage& img) {
      std::swap(img.entries[i], img.entries.back());
    });
  }
  MESSAGE("field edits: " << edits << ", loads rejected: " << o.rejected << ", loaded: " << o.loaded);
  CHECK(o.rejected > edits);  // most edits are caught
  CHECK(o.loaded > 0);        // and the harmless ones (e.g. ignorable flags) still load
}

TEST_CASE("a code byte that names no centroid is rejected wherever it is") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/c.snap", bad = dir + "/bad.snap";
  const std::vector<uint8_t> good = checkpointed_file(rt.get(), path);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  const KvLayout lay = [&] {
    KvLayout l;
    ssa_session_config c = adversary_config();
    REQUIRE(validate_session_config(c, &l).ok());
    return l;
  }();
  int runs = 0;
  for (size_t i = 0; i < base.entries.size(); ++i) {
    if (base.entries[i].kind != uint32_t(snap::SectionKind::kCodePages)) continue;
    ++runs;
    const uint64_t len = base.entries[i].length;
    // First byte, a middle byte, the last byte of the run (the zeroed tail of a
    // partial page included): code K, K+1 and 255.
    for (uint64_t at : {uint64_t{0}, len / 2 + 3, len - 1}) {
      for (uint32_t code : {lay.pq_centroids, lay.pq_centroids + 1, 255u}) {
        SnapshotImage img = base;
        img.body(i)[at] = static_cast<uint8_t>(code);
        img.rehash(i);
        img.seal();
        REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
        // Superseded runs are never used; the run that wins the page must fail.
        for (uint32_t flags : kAllFlags) {
          absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
          if (r.ok()) {
            CHECK(check_loaded_session(**r, true) == "");
            continue;
          }
          CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
          CHECK(std::string(r.status().message()).find("centroids") != std::string::npos);
        }
      }
    }
  }
  CHECK(runs >= 2);
  // The live code page of layer 0 page 0 in particular is always rejected.
  SnapshotImage img = base;
  int live = -1;
  for (size_t i = 0; i < img.entries.size(); ++i) {
    if (img.entries[i].kind == uint32_t(snap::SectionKind::kCodePages) && img.entries[i].layer == 0 &&
        img.entries[i].first == 0)
      live = static_cast<int>(i);  // the last one listed wins
  }
  REQUIRE(live >= 0);
  img.body(live)[1] = 200;
  img.rehash(live);
  img.seal();
  REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
  for (uint32_t flags : kAllFlags) {
    std::string msg;
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
    REQUIRE(!r.ok());
    CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
    CHECK(std::string(r.status().message()).find("code 200") != std::string::npos);
  }
}

TEST_CASE("non-finite K, V or centroids: rejected by every load that reads them") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/n.snap", bad = dir + "/bad.snap";
  for (ssa_dtype dt : {SSA_DTYPE_F16, SSA_DTYPE_F32, SSA_DTYPE_BF16}) {
    CAPTURE(dt);
    const std::vector<uint8_t> good = checkpointed_file(rt.get(), path, dt);
    SnapshotImage base;
    base.bytes = good;
    REQUIRE(base.parse());
    const size_t eb = dt == SSA_DTYPE_F32 ? 4 : 2;
    auto nonfinite = [&](uint8_t* p, int which) {  // 0 NaN, 1 +Inf, 2 -Inf
      const float v = which == 0 ? NAN : which == 1 ? INFINITY : -INFINITY;
      store_from_f32(p, static_cast<DType>(dt), 0, v);
    };
    // The winning KV run of layer 1 page 0: an element in K (start) and in V (end).
    int kv = -1, cb = -1;
    for (size_t i = 0; i < base.entries.size(); ++i) {
      const auto& e = base.entries[i];
      if (e.kind == uint32_t(snap::SectionKind::kKvPages) && e.layer == 1 && e.first == 0) kv = int(i);
      if (e.kind == uint32_t(snap::SectionKind::kCodebooks) && e.layer == 1) cb = int(i);
    }
    REQUIRE(kv >= 0);
    REQUIRE(cb >= 0);
    for (int which = 0; which < 3; ++which) {
      // K of head 0 slot 5, and the last V value of the page (head 1, slot 15).
      const uint64_t page_bytes = uint64_t{2} * 16 * 2 * 32 * eb;
      for (uint64_t at : {uint64_t{eb} * 5, page_bytes - eb}) {
        SnapshotImage img = base;
        nonfinite(img.body(kv) + at, which);
        img.rehash(kv);
        img.seal();
        REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
        for (uint32_t flags : kAllFlags) {
          CAPTURE(flags);
          absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
          if (flags == SSA_LOAD_MMAP) {
            // Documented: a plain mapped load does not read K/V, so cannot check them.
            CHECK(r.ok());
            continue;
          }
          REQUIRE(!r.ok());
          CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
          CHECK(std::string(r.status().message()).find("non-finite") != std::string::npos);
        }
      }
      // A centroid coordinate (codebooks are always read, so every load rejects it).
      SnapshotImage img = base;
      std::vector<uint8_t> f(4);
      store_from_f32(f.data(), DType::kF32, 0, which == 0 ? NAN : which == 1 ? INFINITY : -INFINITY);
      memcpy(img.body(cb) + snap::kCodebooksHeaderBytes + 4 * 7, f.data(), 4);
      img.rehash(cb);
      img.seal();
      REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
      for (uint32_t flags : kAllFlags) {
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
        REQUIRE(!r.ok());
        CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
        CHECK(std::string(r.status().message()).find("centroid") != std::string::npos);
      }
    }
  }
}

TEST_CASE("an unknown kv_dtype in the config is rejected as an integer, never used as an enum") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/d.snap", bad = dir + "/bad.snap";
  const std::vector<uint8_t> good = checkpointed_file(rt.get(), path);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  const int ce = base.find(snap::SectionKind::kConfig);
  REQUIRE(ce >= 0);
  for (uint32_t v : {3u, 4u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
    SnapshotImage img = base;
    snap::put_u32(img.body(ce) + 16, v);
    img.rehash(ce);
    img.seal();
    REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), 0);
    REQUIRE(!r.ok());
    CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
    CHECK(std::string(r.status().message()).find("kv_dtype " + std::to_string(v)) != std::string::npos);
    ssa_snapshot_info info{};
    info.struct_size = sizeof info;
    CHECK(status_code(snapshot_inspect(bad.c_str(), &info)) == SSA_ERR_CORRUPT);
  }
  // The caller's expected config may hold any integer in its enum too.
  ssa_session_config want = adversary_config();
  const uint32_t junk = 0xffffffffu;
  memcpy(&want.kv_dtype, &junk, sizeof junk);
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load_checked(rt.get(), path.c_str(), 0, &want);
  REQUIRE(!r.ok());
  CHECK(status_code(r.status()) == SSA_ERR_MISMATCH);
}

namespace {

std::atomic<uint64_t> g_bytes_read{0};
ssize_t counting_pread(int fd, void* b, size_t n, off_t o) {
  const ssize_t r = snap::posix_file_io().pread(fd, b, n, o);
  if (r > 0) g_bytes_read += static_cast<uint64_t>(r);
  return r;
}

}  // namespace

TEST_CASE("lengths are bounded by what the file holds before anything is allocated or read") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/l.snap", bad = dir + "/big.snap";
  const std::vector<uint8_t> good = checkpointed_file(rt.get(), path);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  snap::FileIo counting = snap::posix_file_io();
  counting.pread = counting_pread;
  constexpr uint64_t kBig = uint64_t{2} << 30;  // a 2 GiB sparse file
  auto sparse = [&](const std::vector<uint8_t>& head, uint64_t table_offset, const uint8_t* table,
                    size_t table_bytes) {
    const int fd = open(bad.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(pwrite(fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()));
    if (table_bytes > 0)
      REQUIRE(pwrite(fd, table, table_bytes, static_cast<off_t>(table_offset)) == static_cast<ssize_t>(table_bytes));
    REQUIRE(ftruncate(fd, static_cast<off_t>(kBig)) == 0);
    close(fd);
  };
  auto expect_cheap_corrupt = [&](const char* what, const char* needle) {
    CAPTURE(what);
    const uint64_t allocs = alloc_calls_made();
    snap::set_file_io(&counting);
    g_bytes_read = 0;
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), 0);
    ssa_snapshot_info info{};
    info.struct_size = sizeof info;
    const absl::Status in = snapshot_inspect(bad.c_str(), &info);
    snap::set_file_io(nullptr);
    REQUIRE(!r.ok());
    CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
    CHECK(status_code(in) == SSA_ERR_CORRUPT);
    CHECK_MESSAGE(std::string(r.status().message()).find(needle) != std::string::npos, r.status().message());
    CHECK(g_bytes_read < (uint64_t{1} << 20));  // both calls together: under 1 MiB of 2 GiB
    CHECK(alloc_calls_made() == allocs);        // no page was allocated
  };
  // 1. The superblock claims a 2 GiB table; the table header says otherwise.
  {
    SnapshotImage img = base;
    img.sb.file_length = kBig;
    img.sb.table_length = kBig - img.sb.table_offset;
    img.reseal_superblock();
    sparse(img.bytes, 0, nullptr, 0);
    expect_cheap_corrupt("table length", "section table header");
  }
  // 2. A table header consistent with a 512 MiB table of zeros (sparse).
  {
    SnapshotImage img = base;
    const uint64_t toff = uint64_t{1} << 30;
    const uint64_t n = ((uint64_t{512} << 20) - snap::kTableHeaderBytes) / snap::kEntryBytes;
    img.sb.table_offset = toff;
    img.sb.table_length = snap::kTableHeaderBytes + n * snap::kEntryBytes;
    img.sb.file_length = toff + img.sb.table_length;
    img.reseal_superblock();
    uint8_t hdr[snap::kTableHeaderBytes] = {};
    memcpy(hdr, snap::kTableMagic, 8);
    snap::put_u32(hdr + 8, static_cast<uint32_t>(n));
    snap::put_u32(hdr + 12, snap::kEntryBytes);
    snap::put_u64(hdr + 16, img.sb.generation);
    snap::put_u64(hdr + 24, img.sb.file_id);
    sparse(img.bytes, toff, hdr, sizeof hdr);
    expect_cheap_corrupt("512 MiB table", "entry #0");
  }
  // 3. Layers claiming more pages than the section area holds, in total.
  {
    SnapshotImage img = base;
    const int le = img.find(snap::SectionKind::kLayers);
    REQUIRE(le >= 0);
    snap::put_u64(img.body(le), uint64_t{3} << 20);  // tokens of layer 0
    snap::put_u64(img.body(le) + 32, uint64_t{3} << 20);
    img.rehash(le);
    img.seal();
    sparse(img.bytes, 0, nullptr, 0);  // the tail beyond the table is sparse
    expect_cheap_corrupt("layer tokens", "more than the file can hold");
  }
}

TEST_CASE("generations at the top of the range: checkpoints never lose a commit") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/g.snap";
  for (uint64_t start : {~uint64_t{0} - 1, ~uint64_t{0}}) {
    CAPTURE(start);
    auto s = make_session(rt.get(), adversary_config(), 30, 9);
    REQUIRE(s);
    REQUIRE(snapshot_save(*s, path.c_str()).ok());
    // Rewrite the file as generation `start` in the slot that generation belongs to.
    SnapshotImage img;
    img.bytes = read_file(path);
    REQUIRE(img.parse());
    memset(img.bytes.data(), 0, snap::kHeaderAreaBytes);
    img.sb.generation = start;
    img.sb.slot = snap::slot_for_generation(start);
    img.slot = static_cast<int>(img.sb.slot);
    img.seal();
    REQUIRE(write_file(path, img.bytes.data(), img.bytes.size()));
    ssa_snapshot_info info{};
    info.struct_size = sizeof info;
    REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
    CHECK(info.generation == start);
    // The session that loaded it checkpoints twice; each reload is the newest state.
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
    REQUIRE(r.ok());
    ssa_session& live = **r;
    std::mt19937_64 rng(start & 0xff);
    for (int step = 0; step < 2; ++step) {
      REQUIRE(append_all_layers(live, 7, rng).ok());
      REQUIRE(snapshot_checkpoint(live, path.c_str()).ok());
      auto back = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
      REQUIRE(back.ok());
      CHECK(store_diff(live, **back) == "");
      REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
      // Past 2^64-1 the checkpoint is a full save: generation 1 of a new file.
      const uint64_t want = start == ~uint64_t{0} - 1 ? (step == 0 ? ~uint64_t{0} : 1)
                                                      : static_cast<uint64_t>(step + 1);
      CHECK(info.generation == want);
    }
  }
  // Generation 0 and a generation in the wrong slot are corrupt, not "older".
  auto s = make_session(rt.get(), adversary_config(), 30, 9);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  for (uint64_t g : {uint64_t{0}, uint64_t{2}}) {
    SnapshotImage img;
    img.bytes = read_file(path);
    REQUIRE(img.parse());
    img.sb.generation = g;
    img.seal();
    REQUIRE(write_file(path, img.bytes.data(), img.bytes.size()));
    std::string msg;
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
    REQUIRE(!r.ok());
    CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
    CHECK(std::string(r.status().message()).find("generation") != std::string::npos);
  }
}

TEST_CASE("the content checks agree with a per-value reference on every value") {
  // Codes: every byte value at a few positions among the largest valid codes.
  KvLayout lay;
  lay.n_layers = 1;
  lay.n_q_heads = 2;
  lay.n_kv_heads = 1;
  lay.head_dim = 32;
  lay.pq_subspaces = 1;
  lay.page_tokens = 16;
  lay.dtype = DType::kF16;
  for (uint32_t k : {2u, 3u, 16u, 127u, 128u, 129u, 200u, 255u, 256u}) {
    lay.pq_centroids = k;
    std::vector<uint8_t> page(lay.code_page_bytes(), 0);
    for (size_t at : {size_t{0}, size_t{7}, size_t{8}, page.size() - 1}) {
      for (uint32_t b = 0; b < 256; ++b) {
        std::fill(page.begin(), page.end(), static_cast<uint8_t>(k - 1));  // the largest valid code
        page[at] = static_cast<uint8_t>(b);
        const bool ok = snap::check_code_page(lay, page.data(), "p", 0, 0).ok();
        CHECK_MESSAGE(ok == (b < k), "k " << k << " byte " << b << " at " << at);
      }
    }
  }
  // K/V: every 16-bit pattern as f16 and bf16 (f32: the patterns' top halves).
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    lay.dtype = t;
    std::vector<uint8_t> page(lay.kv_page_bytes(), 0);
    const size_t n = page.size() / lay.elem_bytes();
    int mismatches = 0;
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const size_t at = bits % n;
      float ref;
      if (t == DType::kF32) {
        const uint32_t w = (bits << 16) | (bits & 0xffffu);
        memcpy(page.data() + at * 4, &w, 4);
        memcpy(&ref, &w, 4);
      } else {
        const uint16_t h = static_cast<uint16_t>(bits);
        memcpy(page.data() + at * 2, &h, 2);
        ref = t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      const bool ok = snap::check_kv_page(lay, page.data(), "p", 0, 0).ok();
      mismatches += ok != std::isfinite(ref);
      memset(page.data() + at * lay.elem_bytes(), 0, lay.elem_bytes());
    }
    CHECK_MESSAGE(mismatches == 0, "dtype " << static_cast<int>(t));
  }
}
