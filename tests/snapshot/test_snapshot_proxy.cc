// The proxy in snapshots (format versions 2 to 5): OPQ, 4-bit and query-aware
// sessions round-trip with their rotations, packed codes, score-aware weight,
// query moments, recent queries and the queries shown since training, every
// loaded rotation, code nibble, weight and query value is checked, damage to the
// new bytes is refused or harmless, and older files still load: version 1 files,
// which hold no proxy, as PQ; version 2 files (written by the version 2 library
// and kept in tests/snapshot/data) as PQ or OPQ with squared-error codebooks;
// version 3 query-aware files (likewise kept) without recent queries; version 4
// files (likewise) with the queries their codebooks were trained from only.
#include <doctest/doctest.h>
#include <math.h>

#include <functional>
#include <initializer_list>
#include <random>

#include "index/rotation.h"
#include "snapshot/format.h"
#include "support/loaded_session_check.h"
#include "support/snapshot_helpers.h"
#include "support/snapshot_image.h"

using namespace ssa;
using namespace ssa::test;

namespace {

constexpr uint32_t kAllFlags[] = {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP, SSA_LOAD_MMAP | SSA_LOAD_VERIFY};

ssa_session_config opq_config() {
  ssa_session_config c = small_config(0x0B0Bu);
  c.head_dim = 32;
  c.pq_subspaces = 8;
  c.index_min_tokens = 48;
  c.proxy = SSA_PROXY_OPQ;
  return c;
}

// A saved and checkpointed OPQ session (retrained in between, so two codebook
// sections per layer exist in the file, one superseded).
std::vector<uint8_t> opq_file(ssa_runtime* rt, const std::string& path, std::unique_ptr<ssa_session>* keep) {
  auto s = make_session(rt, opq_config(), 60, 7);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  std::mt19937_64 rng(8);
  REQUIRE(append_all_layers(*s, 250, rng).ok());  // past index_regrow_factor: retrained
  REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
  if (keep) *keep = std::move(s);
  return read_file(path);
}

// The entry of the live codebooks section of `layer` (the last one in the table).
int live_codebooks(const SnapshotImage& img, uint32_t layer) {
  int found = -1;
  for (size_t i = 0; i < img.entries.size(); ++i) {
    if (img.entries[i].kind == uint32_t(snap::SectionKind::kCodebooks) && img.entries[i].layer == layer) found = int(i);
  }
  return found;
}

size_t rotation_offset(const ssa_session_config& c) {
  return snap::kCodebooksHeaderBytes + sizeof(float) * size_t{c.n_kv_heads} * c.pq_centroids * c.head_dim;
}

}  // namespace

TEST_CASE("an OPQ session round-trips: rotations, codes and decodes identical") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/opq.snap";
  std::unique_ptr<ssa_session> s;
  opq_file(rt.get(), path, &s);
  {
    std::shared_lock lock(s->mu);
    REQUIRE(s->layers[0].codebooks != nullptr);
    REQUIRE(s->layers[0].codebooks->rotated());
  }
  for (uint32_t flags : kAllFlags) {
    CAPTURE(flags);
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
    REQUIRE(r.ok());
    CHECK((*r)->config.proxy == SSA_PROXY_OPQ);
    CHECK(store_diff(*s, **r) == "");
    CHECK(decode_fingerprint(*s, 5) == decode_fingerprint(**r, 5));
  }
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
  CHECK(info.format_version == snap::kFormatVersion);
}

TEST_CASE("a rotation that is not finite or not orthogonal is refused by every load") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/r.snap", bad = dir + "/bad.snap";
  const std::vector<uint8_t> good = opq_file(rt.get(), path, nullptr);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  const ssa_session_config c = opq_config();
  const uint32_t d = c.head_dim;
  // A coordinate replaced (NaN, Inf) or moved by delta: a column of an
  // orthogonal matrix has unit norm, so a move of 0.02 changes some entry of
  // R R^T by at least 0.02 / sqrt(d) > the tolerance.
  struct Edit {
    const char* what;
    size_t at;  // float index within the layer's rotations
    float delta;
    float value;  // used when delta is 0
  };
  const Edit edits[] = {
      {"NaN", 3, 0.0f, NAN},
      {"+Inf", d * d + 5, 0.0f, INFINITY},  // KV head 1
      {"-Inf", 0, 0.0f, -INFINITY},
      {"+0.1", d + 1, 0.1f, 0.0f},
      {"-0.05", 7, -0.05f, 0.0f},
      {"+0.02", d * d + 3 * d + 9, 0.02f, 0.0f},
  };
  for (uint32_t layer = 0; layer < 2; ++layer) {
    const int cb = live_codebooks(base, layer);
    REQUIRE(cb >= 0);
    for (const Edit& e : edits) {
      CAPTURE(layer);
      CAPTURE(e.what);
      SnapshotImage img = base;
      uint8_t* p = img.body(cb) + rotation_offset(c) + 4 * e.at;
      float v;
      memcpy(&v, p, 4);
      const float nv = e.delta != 0.0f ? v + e.delta : e.value;
      memcpy(p, &nv, 4);
      img.rehash(cb);
      img.seal();
      REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
      for (uint32_t flags : kAllFlags) {
        CAPTURE(flags);
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
        REQUIRE(!r.ok());
        CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
        CHECK(std::string(r.status().message()).find("rotation") != std::string::npos);
      }
    }
  }
}

TEST_CASE("the proxy word: unknown values, and values that disagree with the codebooks, are corrupt") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/w.snap", bad = dir + "/bad.snap";
  for (ssa_proxy saved : {SSA_PROXY_PQ, SSA_PROXY_OPQ}) {
    ssa_session_config c = opq_config();
    c.proxy = saved;
    auto s = make_session(rt.get(), c, 80, 9);
    REQUIRE(s);
    REQUIRE(snapshot_save(*s, path.c_str()).ok());
    SnapshotImage base;
    base.bytes = read_file(path);
    REQUIRE(base.parse());
    const int cfg = base.find(snap::SectionKind::kConfig);
    REQUIRE(cfg >= 0);
    CHECK(snap::get_u32(base.body(cfg) + snap::kConfigProxyOff) == uint32_t(saved));
    for (uint32_t v : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
      CAPTURE(saved);
      CAPTURE(v);
      SnapshotImage img = base;
      snap::put_u32(img.body(cfg) + snap::kConfigProxyOff, v);
      img.rehash(cfg);
      img.seal();
      REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
      for (uint32_t flags : kAllFlags) {
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
        if (v == uint32_t(saved)) {
          CHECK(r.ok());
          continue;
        }
        // Another one-byte proxy changes the codebooks' length, a 4-bit one the
        // code pages' size; others are unknown.
        REQUIRE(!r.ok());
        CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
        const char* says = v <= 1 || v == 4 ? "codebooks" : v <= 5 ? "pages" : "proxy";
        CHECK(std::string(r.status().message()).find(says) != std::string::npos);
      }
    }
  }
}

TEST_CASE("random damage to an OPQ file's codebooks and config is refused or loads a sound session") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/f.snap", bad = dir + "/bad.snap";
  const std::vector<uint8_t> good = opq_file(rt.get(), path, nullptr);
  SnapshotImage base;
  base.bytes = good;
  REQUIRE(base.parse());
  std::vector<int> targets = {live_codebooks(base, 0), live_codebooks(base, 1),
                              base.find(snap::SectionKind::kConfig)};
  std::mt19937_64 rng(77);
  int rejected = 0, loaded = 0;
  for (int trial = 0; trial < 150; ++trial) {
    SnapshotImage img = base;
    const int i = targets[trial % targets.size()];
    REQUIRE(i >= 0);
    const uint64_t len = img.entries[i].length;
    const int flips = 1 + int(rng() % 3);
    for (int f = 0; f < flips; ++f) img.body(i)[rng() % len] ^= uint8_t(1u << (rng() % 8));
    img.rehash(i);
    img.seal();
    REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
    const uint32_t flags = kAllFlags[trial % 4];
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
    if (!r.ok()) {
      const ssa_status st = status_code(r.status());
      CHECK((st == SSA_ERR_CORRUPT || st == SSA_ERR_VERSION));
      ++rejected;
      continue;
    }
    ++loaded;
    // Whatever loaded holds rotations that pass the check, and decodes soundly.
    {
      std::shared_lock lock((*r)->mu);
      for (const LayerStore& L : (*r)->layers) {
        if (L.codebooks == nullptr || !L.codebooks->rotated()) continue;
        for (uint32_t h = 0; h < L.codebooks->n_kv_heads; ++h)
          CHECK(orthogonality_error(L.codebooks->rotation_of(h), L.codebooks->head_dim()) <= kRotationTolerance);
      }
    }
    CHECK(check_loaded_session(**r, flags != SSA_LOAD_MMAP) == "");
  }
  MESSAGE("rejected " << rejected << ", loaded " << loaded);
  CHECK(rejected > 0);
}

TEST_CASE("version 1 files load as PQ whatever their reserved config word holds, and are upgraded by a checkpoint") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/v1.snap";
  ssa_session_config c = opq_config();
  c.proxy = SSA_PROXY_PQ;
  auto s = make_session(rt.get(), c, 80, 10);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  // Make it what a version 1 writer wrote: version 1 in the superblock, and the
  // word at 52 reserved (a v1 reader ignores it, so any value is valid there).
  SnapshotImage img;
  img.bytes = read_file(path);
  REQUIRE(img.parse());
  img.sb.format_version = 1;
  const int cfg = img.find(snap::SectionKind::kConfig);
  snap::put_u32(img.body(cfg) + snap::kConfigProxyOff, 0xdeadbeefu);
  img.rehash(cfg);
  img.seal();
  REQUIRE(write_file(path, img.bytes.data(), img.bytes.size()));
  for (uint32_t flags : kAllFlags) {
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
    REQUIRE(r.ok());
    CHECK((*r)->config.proxy == SSA_PROXY_PQ);
    CHECK(store_diff(*s, **r) == "");
  }
  // A checkpoint of the loaded session must not leave a newer superblock over
  // the version 1 config: it rewrites the file whole.
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(r.ok());
  std::mt19937_64 rng(11);
  REQUIRE(append_all_layers(**r, 20, rng).ok());
  REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
  CHECK(info.format_version == snap::kFormatVersion);
  absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(again.ok());
  CHECK(store_diff(**r, **again) == "");
}

TEST_CASE("the committed version 1 corpus files still load, as PQ sessions") {
  auto rt = make_runtime();
  const std::string dir = SSA_FUZZ_CORPUS_DIR;
  int loaded = 0;
  for (const std::string& f : list_dir(dir)) {
    // valid_row_runs_*: written by a version 2 writer (checkpoints with row runs);
    // valid_queries_*: by a version 5 writer (a query-aware session's sections).
    if (f.rfind("valid_", 0) != 0 || f.rfind("valid_row_runs_", 0) == 0 || f.rfind("valid_queries_", 0) == 0) continue;
    CAPTURE(f);
    SnapshotImage img;
    img.bytes = read_file(dir + "/" + f);
    REQUIRE(img.parse());
    CHECK(img.sb.format_version == 1);
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), (dir + "/" + f).c_str(), 0);
    REQUIRE(r.ok());
    CHECK((*r)->config.proxy == SSA_PROXY_PQ);
    CHECK(check_loaded_session(**r, true) == "");
    ++loaded;
  }
  CHECK(loaded >= 4);
}

namespace {

ssa_session_config four_bit_config(ssa_proxy proxy, uint32_t centroids, float weight) {
  ssa_session_config c = small_config(0x4B17u);
  c.head_dim = 32;
  c.pq_subspaces = 16;
  c.pq_centroids = centroids;
  c.index_min_tokens = 48;
  c.proxy = proxy;
  c.pq_parallel_weight = weight;
  return c;
}

// A file after a save of `c` (every page live: no checkpoint).
SnapshotImage saved_image(ssa_runtime* rt, const ssa_session_config& c, const std::string& path) {
  auto s = make_session(rt, c, 70, 31);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  SnapshotImage img;
  img.bytes = read_file(path);
  REQUIRE(img.parse());
  return img;
}

absl::Status load_edited(ssa_runtime* rt, SnapshotImage& img, const std::string& bad, uint32_t flags) {
  img.seal();
  REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
  return snapshot_load(rt, bad.c_str(), flags).status();
}

// Every load of the edited image, whatever its flags, refuses it as corrupt
// with a message naming each of `says`.
void check_refused_by_every_load(ssa_runtime* rt, SnapshotImage& img, const std::string& bad,
                                 std::initializer_list<std::string> says) {
  for (uint32_t flags : kAllFlags) {
    CAPTURE(flags);
    const absl::Status st = load_edited(rt, img, bad, flags);
    REQUIRE(!st.ok());
    const std::string message(st.message());
    INFO(message);
    CHECK(status_code(st) == SSA_ERR_CORRUPT);
    for (const std::string& part : says) CHECK(message.find(part) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("4-bit and score-aware sessions round-trip: packed codes, rotations, weight and decodes identical") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/q4.snap";
  for (ssa_proxy proxy : {SSA_PROXY_PQ4, SSA_PROXY_OPQ4}) {
    for (float weight : {1.0f, 3.5f}) {
      CAPTURE(proxy);
      CAPTURE(weight);
      const ssa_session_config c = four_bit_config(proxy, 16, weight);
      auto s = make_session(rt.get(), c, 60, 21);
      REQUIRE(s);
      REQUIRE(snapshot_save(*s, path.c_str()).ok());
      std::mt19937_64 rng(22);
      REQUIRE(append_all_layers(*s, 250, rng).ok());  // retrained: a second codebooks section
      REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
      for (uint32_t flags : kAllFlags) {
        CAPTURE(flags);
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
        REQUIRE(r.ok());
        CHECK((*r)->config.proxy == proxy);
        CHECK((*r)->config.pq_parallel_weight == weight);
        CHECK((*r)->layout.code_bits == 4);
        CHECK(store_diff(*s, **r) == "");
        CHECK(decode_fingerprint(*s, 5) == decode_fingerprint(**r, 5));
        // Appends after the load encode as the saved session's do.
        std::mt19937_64 a(23), b(23);
        REQUIRE(append_all_layers(*s, 9, a).ok());
        REQUIRE(append_all_layers(**r, 9, b).ok());
        CHECK(store_diff(*s, **r) == "");
        REQUIRE(session_truncate(*s, session_length(*s) - 9).ok());
      }
      ssa_snapshot_info info{};
      info.struct_size = sizeof info;
      REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
      CHECK(info.format_version == snap::kFormatVersion);
      CHECK(info.proxy == proxy);
      CHECK(info.pq_parallel_weight == weight);
    }
  }
}

TEST_CASE("a 4-bit code page whose nibble names no centroid is refused, low or high nibble") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/n.snap", bad = dir + "/bad.snap";
  const ssa_session_config c = four_bit_config(SSA_PROXY_PQ4, 12, 1.0f);
  const SnapshotImage base = saved_image(rt.get(), c, path);
  int code_runs = 0;
  for (size_t i = 0; i < base.entries.size(); ++i) {
    if (base.entries[i].kind != uint32_t(snap::SectionKind::kCodePages)) continue;
    ++code_runs;
    for (int high = 0; high < 2; ++high) {
      for (uint8_t nibble : {uint8_t{12}, uint8_t{15}}) {
        CAPTURE(i);
        CAPTURE(high);
        CAPTURE(int(nibble));
        SnapshotImage img = base;
        // The run's first page, head 0, code row 1 (subspaces 2 and 3), slot 9:
        // rows of page_tokens = 16 bytes.
        uint8_t* b = img.body(i) + 1 * 16 + 9;
        *b = high ? static_cast<uint8_t>((*b & 0x0f) | (nibble << 4)) : static_cast<uint8_t>((*b & 0xf0) | nibble);
        img.rehash(i);
        check_refused_by_every_load(rt.get(), img, bad,
                                    {"holds code " + std::to_string(nibble), high ? "subspace 3" : "subspace 2"});
      }
    }
  }
  CHECK(code_runs >= 2);
  // Every nibble below 12 is fine: the unedited file loads.
  CHECK(snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY).ok());
}

TEST_CASE("the weight word (version 3): out of range or not a number is corrupt, 0 reads as squared error") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/w3.snap", bad = dir + "/bad.snap";
  const SnapshotImage base = saved_image(rt.get(), four_bit_config(SSA_PROXY_OPQ4, 16, 2.0f), path);
  const int cfg = base.find(snap::SectionKind::kConfig);
  REQUIRE(cfg >= 0);
  for (float w : {0.5f, -1.0f, 1000.5f, NAN, INFINITY, 0.0f, 1.0f, 1000.0f}) {
    CAPTURE(w);
    SnapshotImage img = base;
    memcpy(img.body(cfg) + snap::kConfigWeightOff, &w, 4);
    img.rehash(cfg);
    const absl::Status st = load_edited(rt.get(), img, bad, 0);
    const bool fine = w == 0.0f || (w >= 1.0f && w <= 1000.0f);
    CHECK(st.ok() == fine);
    if (!fine) {
      CHECK(status_code(st) == SSA_ERR_CORRUPT);
      CHECK(std::string(st.message()).find("pq_parallel_weight") != std::string::npos);
    }
  }
}

TEST_CASE("version 2 files: the word at 80 is reserved (any value loads as weight 1), newer proxies are corrupt") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/v2.snap", bad = dir + "/bad.snap";
  ssa_session_config c = four_bit_config(SSA_PROXY_OPQ, 16, 1.0f);
  c.pq_subspaces = 8;
  const SnapshotImage base = saved_image(rt.get(), c, path);
  const int cfg = base.find(snap::SectionKind::kConfig);
  {
    SnapshotImage img = base;
    img.sb.format_version = 2;
    const uint32_t junk = 0xdeadbeefu;
    memcpy(img.body(cfg) + snap::kConfigWeightOff, &junk, 4);
    img.rehash(cfg);
    img.seal();
    REQUIRE(write_file(bad, img.bytes.data(), img.bytes.size()));
    for (uint32_t flags : kAllFlags) {
      absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), bad.c_str(), flags);
      REQUIRE(r.ok());
      CHECK((*r)->config.proxy == SSA_PROXY_OPQ);
      CHECK((*r)->config.pq_parallel_weight == 1.0f);
    }
  }
  for (uint32_t proxy : {2u, 3u, 4u, 5u}) {
    CAPTURE(proxy);
    SnapshotImage img = base;
    img.sb.format_version = 2;
    snap::put_u32(img.body(cfg) + snap::kConfigProxyOff, proxy);
    img.rehash(cfg);
    const absl::Status st = load_edited(rt.get(), img, bad, 0);
    REQUIRE(!st.ok());
    CHECK(status_code(st) == SSA_ERR_CORRUPT);
    CHECK(std::string(st.message()).find("unknown proxy " + std::to_string(proxy) + " in a version 2 file") !=
          std::string::npos);
  }
}

TEST_CASE("files written by the version 2 library load (PQ, OPQ), decode, and a checkpoint rewrites them in the current version") {
  auto rt = make_runtime();
  const std::string dir = temp_dir();
  int loaded = 0;
  for (const char* name : {"v2_pq_f16.ssa", "v2_opq_f16.ssa"}) {
    CAPTURE(name);
    const std::string src = std::string(SSA_SNAPSHOT_DATA_DIR) + "/" + name, path = dir + "/" + name;
    const std::vector<uint8_t> bytes = read_file(src);
    REQUIRE(!bytes.empty());
    REQUIRE(write_file(path, bytes.data(), bytes.size()));
    SnapshotImage img;
    img.bytes = bytes;
    REQUIRE(img.parse());
    CHECK(img.sb.format_version == 2);
    const bool rotated = std::string(name).find("opq") != std::string::npos;
    {
      ssa_snapshot_info info{};
      info.struct_size = sizeof info;
      REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
      CHECK(info.proxy == (rotated ? SSA_PROXY_OPQ : SSA_PROXY_PQ));
      CHECK(info.pq_parallel_weight == 1.0f);
    }
    for (uint32_t flags : kAllFlags) {
      absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
      REQUIRE(r.ok());
      ssa_session& s = **r;
      CHECK(s.config.proxy == (rotated ? SSA_PROXY_OPQ : SSA_PROXY_PQ));
      CHECK(s.config.pq_parallel_weight == 1.0f);
      CHECK(s.config.model_fingerprint == 0x0B0B0002ull);
      CHECK(session_length(s) == 57);
      {
        std::shared_lock lock(s.mu);
        for (const LayerStore& L : s.layers) {
          REQUIRE(L.codebooks != nullptr);
          CHECK(L.codebooks->rotated() == rotated);
        }
      }
      CHECK(check_loaded_session(s, flags != SSA_LOAD_MMAP) == "");
      ++loaded;
    }
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
    REQUIRE(r.ok());
    std::mt19937_64 rng(41);
    REQUIRE(append_all_layers(**r, 5, rng).ok());
    REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
    ssa_snapshot_info info{};
    info.struct_size = sizeof info;
    REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
    CHECK(info.format_version == snap::kFormatVersion);
    absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
    REQUIRE(again.ok());
    CHECK(store_diff(**r, **again) == "");
    CHECK(decode_fingerprint(**r, 6) == decode_fingerprint(**again, 6));
  }
  CHECK(loaded == 8);
}

namespace {

ssa_session_config qpq_file_config(ssa_proxy proxy) {
  ssa_session_config c = four_bit_config(proxy, 16, 1.0f);
  c.pq_subspaces = proxy == SSA_PROXY_QPQ4 ? 16 : 8;
  return c;
}

// Queries [n][n_q_heads][head_dim] in the session's dtype.
std::vector<uint8_t> random_queries(const ssa_session& s, uint64_t n, std::mt19937_64& rng) {
  const KvLayout& L = s.layout;
  std::vector<uint8_t> out(n * L.n_q_heads * L.head_dim * L.elem_bytes());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < n * L.n_q_heads * L.head_dim; ++i)
    store_from_f32(out.data(), L.dtype, i, nd(rng) * (i % L.head_dim < 4 ? 3.0f : 0.5f));
  return out;
}

// A query-aware session shown queries before its layers train, saved.
std::unique_ptr<ssa_session> qpq_session(ssa_runtime* rt, ssa_proxy proxy, const std::string& path) {
  auto s = make_session(rt, qpq_file_config(proxy), 0, 51);
  REQUIRE(s);
  std::mt19937_64 rng(52);
  for (uint32_t l = 0; l < s->layout.n_layers; ++l) {
    const std::vector<uint8_t> q = random_queries(*s, 20 + l, rng);
    REQUIRE(session_observe_queries(*s, l, q.data(), 20 + l).ok());
  }
  REQUIRE(append_all_layers(*s, 70, rng).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  return s;
}

// The file qpq_session saves, parsed.
SnapshotImage qpq_image(ssa_runtime* rt, ssa_proxy proxy, const std::string& path) {
  qpq_session(rt, proxy, path);
  SnapshotImage img;
  img.bytes = read_file(path);
  REQUIRE(img.parse());
  return img;
}

// Byte offsets inside a query-aware codebooks section (docs/SNAPSHOT_FORMAT.md):
// the query transforms, the query counts and moment sums, the recent query
// counts and the recent queries.
struct QueryAwareOffsets {
  size_t query_transform, count, sum, recent_count, recent;
};
QueryAwareOffsets query_aware_offsets(const ssa_session_config& c) {
  const size_t square = size_t{c.n_kv_heads} * c.head_dim * c.head_dim;
  QueryAwareOffsets o;
  o.query_transform = rotation_offset(c) + square * sizeof(float);
  o.count = o.query_transform + square * sizeof(float);
  o.sum = o.count + c.n_kv_heads * sizeof(uint64_t);
  o.recent_count = o.sum + square * sizeof(double);
  o.recent = o.recent_count + c.n_kv_heads * sizeof(uint64_t);
  return o;
}

}  // namespace

TEST_CASE("a query-aware session round-trips its transforms and query moments; loaded, it retrains as the saved one") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/qpq.snap";
  for (ssa_proxy proxy : {SSA_PROXY_QPQ, SSA_PROXY_QPQ4}) {
    CAPTURE(proxy);
    auto s = qpq_session(rt.get(), proxy, path);
    for (uint32_t flags : kAllFlags) {
      CAPTURE(flags);
      absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
      REQUIRE(r.ok());
      CHECK(store_diff(*s, **r) == "");
      CHECK(decode_fingerprint(*s, 5) == decode_fingerprint(**r, 5));
      std::shared_lock la(s->mu), lb((*r)->mu);
      for (uint32_t l = 0; l < s->layout.n_layers; ++l) {
        const PqCodebooks& a = *s->layers[l].codebooks;
        const PqCodebooks& b = *(*r)->layers[l].codebooks;
        CHECK(a.rotation == b.rotation);
        CHECK(a.query_transform == b.query_transform);
        REQUIRE(b.trained_moments != nullptr);
        CHECK(a.trained_moments->count == b.trained_moments->count);
        CHECK(a.trained_moments->sum == b.trained_moments->sum);
        CHECK(a.trained_moments->recent_count == b.trained_moments->recent_count);
        CHECK(a.trained_moments->recent == b.trained_moments->recent);
        CHECK(b.trained_moments->recent_count[0] == 2 * (20 + l));
        CHECK((*r)->layers[l].query_moments == b.trained_moments);
      }
    }
    // Shown the same new queries and retrained, both learn the same index.
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
    REQUIRE(r.ok());
    std::mt19937_64 rng(53);
    const std::vector<uint8_t> q = random_queries(*s, 7, rng);
    for (ssa_session* x : {s.get(), r->get()}) {
      REQUIRE(session_observe_queries(*x, 1, q.data(), 7).ok());
      REQUIRE(session_update_index(*x).ok());
    }
    CHECK(store_diff(*s, **r) == "");
    std::shared_lock la(s->mu), lb((*r)->mu);
    CHECK(s->layers[1].codebooks->query_transform == (*r)->layers[1].codebooks->query_transform);
    CHECK(s->layers[1].codebooks->trained_moments->count[0] == 2 * (21 + 7));
  }
}

TEST_CASE("damaged query transforms or query moments are refused by every load") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/qd.snap", bad = dir + "/bad.snap";
  SnapshotImage base = qpq_image(rt.get(), SSA_PROXY_QPQ, path);
  const ssa_session_config c = qpq_file_config(SSA_PROXY_QPQ);
  const QueryAwareOffsets off = query_aware_offsets(c);
  const size_t q_off = off.query_transform, count_off = off.count, sum_off = off.sum;
  const uint32_t d = c.head_dim;
  struct Edit {
    const char* what;
    size_t at;
    int kind;  // 0: float at `at` += 0.05, 1: double at `at` := NaN, 2: double += 1 (breaks symmetry),
               // 3: double := -1 (negative diagonal), 4: count := 0 (sums stay), 5: count := 2^48 + 1,
               // 6: an off-diagonal pair := 1e6 (symmetric, beyond Cauchy-Schwarz)
    const char* says;
  };
  const Edit edits[] = {
      {"query transform entry", q_off + 4 * (d + 3), 0, "inverse transpose"},
      {"moment NaN", sum_off + 8 * 5, 1, "query moments"},
      {"moment asymmetric", sum_off + 8 * (2 * d + 1), 2, "query moments"},
      {"negative diagonal", sum_off + 8 * (d * d + 3 * d + 3), 3, "query moments"},
      {"count 0, sums kept", count_off + 8, 4, "query moments"},
      {"count too large", count_off, 5, "more than"},
      {"off-diagonal beyond |s_ij| <= sqrt(s_ii s_jj)", sum_off + 8 * (d * d + 2 * d + 7), 6, "query moments"},
  };
  for (uint32_t layer = 0; layer < 2; ++layer) {
    const int cb = live_codebooks(base, layer);
    REQUIRE(cb >= 0);
    for (const Edit& e : edits) {
      CAPTURE(layer);
      CAPTURE(e.what);
      SnapshotImage img = base;
      uint8_t* p = img.body(cb) + e.at;
      if (e.kind == 0) {
        float v;
        memcpy(&v, p, 4);
        v += 0.05f;
        memcpy(p, &v, 4);
      } else if (e.kind == 4) {
        snap::put_u64(p, 0);
      } else if (e.kind == 5) {
        snap::put_u64(p, (uint64_t{1} << 48) + 1);
      } else if (e.kind == 6) {
        // Entry (2, 7) of head 1 and its mirror (7, 2), so the sums stay symmetric.
        const double big = 1e6;
        memcpy(p, &big, 8);
        memcpy(img.body(cb) + sum_off + 8 * (d * d + 7 * d + 2), &big, 8);
      } else {
        double v;
        memcpy(&v, p, 8);
        v = e.kind == 1 ? NAN : e.kind == 2 ? v + 1.0 : -1.0;
        memcpy(p, &v, 8);
      }
      img.rehash(cb);
      check_refused_by_every_load(rt.get(), img, bad, {e.says});
    }
  }
}

TEST_CASE("damaged recent queries are refused by every load") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/qr.snap", bad = dir + "/bad.snap";
  SnapshotImage base = qpq_image(rt.get(), SSA_PROXY_QPQ4, path);
  const ssa_session_config c = qpq_file_config(SSA_PROXY_QPQ4);
  const uint32_t d = c.head_dim;
  const QueryAwareOffsets off = query_aware_offsets(c);
  const size_t recent_count_off = off.recent_count, recent_off = off.recent;
  const size_t head1 = recent_off + sizeof(float) * size_t{kRecentQueries} * d;  // KV head 1's rows
  for (uint32_t layer = 0; layer < 2; ++layer) {
    const int cb = live_codebooks(base, layer);
    REQUIRE(cb >= 0);
    const uint64_t kept = 2 * (20 + layer);
    REQUIRE(snap::get_u64(base.body(cb) + recent_count_off) == kept);
    REQUIRE(base.entries[size_t(cb)].length == snap::codebooks_section_bytes(c, snap::kFormatVersion));
    struct Edit {
      const char* what;
      size_t at;
      int kind;  // 0: u64 := value, 1: float := value
      double value;
      const char* says;
    };
    const Edit edits[] = {
        {"more kept than observed", recent_count_off, 0, double(kept + 1), "recent queries of"},
        {"more kept than kept at most", recent_count_off + 8, 0, double(kRecentQueries + 1), "recent queries of"},
        {"a kept entry NaN", recent_off + 4 * (3 * d + 5), 1, NAN, "is not one of the observed queries"},
        {"a kept entry infinite", head1 + 4 * 7, 1, INFINITY, "is not one of the observed queries"},
        {"a kept entry beyond the moments' diagonal", recent_off + 4 * 2, 1, 1e4, "is not one of the observed queries"},
        {"a row after the kept ones not zero", head1 + 4 * (kept * d + 1), 1, 0.25, "is not one of the observed queries"},
    };
    for (const Edit& e : edits) {
      CAPTURE(layer);
      CAPTURE(e.what);
      SnapshotImage img = base;
      uint8_t* p = img.body(cb) + e.at;
      if (e.kind == 0) {
        snap::put_u64(p, static_cast<uint64_t>(e.value));
      } else {
        const float v = static_cast<float>(e.value);
        memcpy(p, &v, 4);
      }
      img.rehash(cb);
      check_refused_by_every_load(rt.get(), img, bad, {e.says});
    }
  }
  // Fewer kept than observed is fine (a window of the last ones): the count
  // lowered with its rows zeroed loads.
  {
    SnapshotImage img = base;
    const int cb = live_codebooks(base, 0);
    snap::put_u64(img.body(cb) + recent_count_off, 3);
    memset(img.body(cb) + recent_off + 4 * 3 * d, 0, 4 * (kRecentQueries - 3) * d);
    img.rehash(cb);
    CHECK(load_edited(rt.get(), img, bad, SSA_LOAD_VERIFY).ok());
  }
}

namespace {

// Copies tests/snapshot/data/`name` into dir and returns its path, after checking
// its format version and loading it with every flag: the proxy, fingerprint and
// length it was written with, each of its 2 layers passing check_layer, and the
// loaded session consistent.
std::string load_fixture_every_way(ssa_runtime* rt, const std::string& dir, const char* name, uint32_t version,
                                   ssa_proxy proxy, uint64_t fingerprint,
                                   const std::function<void(uint32_t, const LayerStore&)>& check_layer) {
  const std::string path = dir + "/" + name;
  const std::vector<uint8_t> bytes = read_file(std::string(SSA_SNAPSHOT_DATA_DIR) + "/" + name);
  REQUIRE(!bytes.empty());
  REQUIRE(write_file(path, bytes.data(), bytes.size()));
  SnapshotImage img;
  img.bytes = bytes;
  REQUIRE(img.parse());
  CHECK(img.sb.format_version == version);
  CHECK(img.find(snap::SectionKind::kQueries) < 0);
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
  CHECK(info.proxy == proxy);
  CHECK(info.pq_parallel_weight == 1.0f);
  for (uint32_t flags : kAllFlags) {
    CAPTURE(flags);
    absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt, path.c_str(), flags);
    REQUIRE(r.ok());
    ssa_session& s = **r;
    CHECK(s.config.proxy == proxy);
    CHECK(s.config.model_fingerprint == fingerprint);
    CHECK(session_length(s) == 70);
    {
      std::shared_lock lock(s.mu);
      for (uint32_t l = 0; l < 2; ++l) {
        CAPTURE(l);
        check_layer(l, s.layers[l]);
      }
    }
    CHECK(check_loaded_session(s, flags != SSA_LOAD_MMAP) == "");
  }
  return path;
}

}  // namespace

// tests/snapshot/data/v3_qpq4_f16.ssa was written by the version 3 library: 2
// layers, 4 q / 2 KV heads, head dim 32, f16, SSA_PROXY_QPQ4 of 16 subspaces x 16
// centroids, page_tokens 16, index_min_tokens 64, train sample 256, 2
// iterations, model fingerprint 0x0B0B0003; layer l shown 20 + l random queries
// (4 leading dimensions of scale 3, the rest 0.5), then 70 random tokens.
TEST_CASE("version 3 query-aware files load without recent queries, retrain from new ones, and checkpoint as version 4") {
  auto rt = make_runtime();
  const std::string dir = temp_dir();
  const std::string path = load_fixture_every_way(rt.get(), dir, "v3_qpq4_f16.ssa", 3, SSA_PROXY_QPQ4, 0x0B0B0003ull,
                                                  [](uint32_t l, const LayerStore& layer) {
                                                    const QueryMoments* qm = layer.query_moments.get();
                                                    REQUIRE(qm != nullptr);
                                                    CHECK(qm->count[0] == 2 * (20 + l));
                                                    CHECK(qm->recent_count.empty());
                                                  });
  // Shown new queries, a layer keeps only those as recent and retrains from
  // them; the checkpoint writes version 4 and loads back the same.
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(r.ok());
  std::mt19937_64 rng(54);
  const std::vector<uint8_t> q = random_queries(**r, 5, rng);
  REQUIRE(session_observe_queries(**r, 0, q.data(), 5).ok());
  REQUIRE(session_update_index(**r).ok());
  {
    std::shared_lock lock((*r)->mu);
    const QueryMoments& qm = *(*r)->layers[0].codebooks->trained_moments;
    CHECK(qm.count[1] == 2 * (20 + 5));
    CHECK(qm.recent_count[1] == 2 * 5);
  }
  REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
  CHECK(info.format_version == snap::kFormatVersion);
  absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
  REQUIRE(again.ok());
  CHECK(store_diff(**r, **again) == "");
  CHECK(decode_fingerprint(**r, 6) == decode_fingerprint(**again, 6));
  std::shared_lock la((*r)->mu), lb((*again)->mu);
  for (uint32_t l = 0; l < 2; ++l) {
    const QueryMoments* a = (*r)->layers[l].codebooks->trained_moments.get();
    const QueryMoments* b = (*again)->layers[l].codebooks->trained_moments.get();
    REQUIRE(b != nullptr);
    CHECK(a->sum == b->sum);
    // Layer 1 was not retrained: its moments came from the version 3 file and
    // are written with no recent queries.
    CHECK(b->recent_count == std::vector<uint64_t>(2, l == 0 ? 10 : 0));
    if (l == 0) CHECK(a->recent == b->recent);
  }
}

namespace {

bool same_moments(const QueryMoments* a, const QueryMoments* b) {
  if (a == nullptr || b == nullptr) return a == b;
  return a->count == b->count && a->sum == b->sum && a->recent_count == b->recent_count && a->recent == b->recent;
}

int count_sections(const SnapshotImage& img, snap::SectionKind kind) {
  int n = 0;
  for (const snap::SectionEntry& e : img.entries) n += e.kind == uint32_t(kind);
  return n;
}

// A query-aware session whose layer 0 was shown queries before and after its
// training and whose layer 1 was shown queries but holds too few tokens to train.
std::unique_ptr<ssa_session> shown_after_training(ssa_runtime* rt, ssa_proxy proxy) {
  auto s = make_session(rt, qpq_file_config(proxy), 0, 61);
  REQUIRE(s);
  std::mt19937_64 rng(62);
  const std::vector<uint8_t> q = random_queries(*s, 30, rng);
  REQUIRE(session_observe_queries(*s, 0, q.data(), 20).ok());
  REQUIRE(append_random(*s, 0, 70, rng).ok());  // past index_min_tokens: trained
  REQUIRE(session_observe_queries(*s, 0, q.data() + q.size() / 30 * 20, 10).ok());
  REQUIRE(session_observe_queries(*s, 1, q.data(), 25).ok());
  REQUIRE(append_random(*s, 1, 30, rng).ok());  // below index_min_tokens: not trained
  std::shared_lock lock(s->mu);
  REQUIRE(s->layers[0].codebooks != nullptr);
  REQUIRE(s->layers[0].query_moments->count[0] == 2 * 30);
  REQUIRE(s->layers[0].codebooks->trained_moments->count[0] == 2 * 20);
  REQUIRE(s->layers[1].codebooks == nullptr);
  return s;
}

// Both sessions' observed queries equal, and after the same training the same
// index and decodes.
void check_retrains_alike(ssa_session& a, ssa_session& b) {
  {
    std::shared_lock la(a.mu), lb(b.mu);
    for (uint32_t l = 0; l < a.layout.n_layers; ++l) {
      CAPTURE(l);
      CHECK(same_moments(a.layers[l].query_moments.get(), b.layers[l].query_moments.get()));
    }
  }
  REQUIRE(session_update_index(a).ok());
  REQUIRE(session_update_index(b).ok());
  CHECK(store_diff(a, b) == "");
  CHECK(decode_fingerprint(a, 9) == decode_fingerprint(b, 9));
}

// Section i of `from` copied into img after its sections (the table moved past it).
void append_section(SnapshotImage& img, SnapshotImage& from, size_t i) {
  snap::SectionEntry e = from.entries[i];
  e.offset = (img.sb.table_offset + 63) / 64 * 64;
  img.bytes.resize(e.offset);
  img.bytes.insert(img.bytes.end(), from.body(i), from.body(i) + e.length);
  img.sb.table_offset = (img.bytes.size() + 63) / 64 * 64;
  img.bytes.resize(img.sb.table_offset);
  img.entries.push_back(e);
}

}  // namespace

TEST_CASE("queries shown since training, or to a layer not trained yet, survive save, checkpoint and load") {
  auto rt = make_runtime();
  const std::string dir = temp_dir();
  for (ssa_proxy proxy : {SSA_PROXY_QPQ, SSA_PROXY_QPQ4}) {
    CAPTURE(proxy);
    for (bool checkpoint : {false, true}) {
      CAPTURE(checkpoint);
      const std::string path = dir + (checkpoint ? "/ck.snap" : "/save.snap");
      auto s = shown_after_training(rt.get(), proxy);
      // A checkpoint before the last observation: the file's queries section is
      // rewritten by the next one.
      if (checkpoint) REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
      std::mt19937_64 rng(63);
      const std::vector<uint8_t> q = random_queries(*s, 4, rng);
      REQUIRE(session_observe_queries(*s, 1, q.data(), 4).ok());
      REQUIRE((checkpoint ? snapshot_checkpoint(*s, path.c_str()) : snapshot_save(*s, path.c_str())).ok());
      SnapshotImage img;
      img.bytes = read_file(path);
      REQUIRE(img.parse());
      CHECK(img.sb.format_version == snap::kFormatVersion);
      CHECK(count_sections(img, snap::SectionKind::kQueries) == 2);
      for (uint32_t flags : kAllFlags) {
        CAPTURE(flags);
        absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), flags);
        REQUIRE(r.ok());
        {
          std::shared_lock la(s->mu), lb((*r)->mu);
          REQUIRE((*r)->layers[0].codebooks != nullptr);
          CHECK(same_moments((*r)->layers[0].codebooks->trained_moments.get(),
                             s->layers[0].codebooks->trained_moments.get()));
          CHECK((*r)->layers[1].query_moments->count[1] == 2 * (25 + 4));
        }
        CHECK(decode_fingerprint(*s, 8) == decode_fingerprint(**r, 8));
      }
      absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
      REQUIRE(r.ok());
      // The loaded session, checkpointed with nothing new shown, keeps its
      // queries sections; retrained (the queries are its codebooks' now), it
      // writes none.
      REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
      img.bytes = read_file(path);
      REQUIRE(img.parse());
      CHECK(count_sections(img, snap::SectionKind::kQueries) == 2);
      check_retrains_alike(*s, **r);
      REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
      img.bytes = read_file(path);
      REQUIRE(img.parse());
      CHECK(count_sections(img, snap::SectionKind::kQueries) == 0);
      absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
      REQUIRE(again.ok());
      CHECK(store_diff(**r, **again) == "");
      std::shared_lock la((*r)->mu), lb((*again)->mu);
      for (uint32_t l = 0; l < 2; ++l) {
        CHECK(same_moments((*r)->layers[l].query_moments.get(), (*again)->layers[l].query_moments.get()));
      }
    }
  }
}

TEST_CASE("a forked query-aware session saves the queries it was shown, not its parent's later ones") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/fork.snap";
  auto s = shown_after_training(rt.get(), SSA_PROXY_QPQ);
  absl::StatusOr<std::unique_ptr<ssa_session>> f = session_fork(*s);
  REQUIRE(f.ok());
  std::mt19937_64 rng(64);
  const std::vector<uint8_t> q = random_queries(*s, 6, rng);
  REQUIRE(session_observe_queries(*s, 0, q.data(), 6).ok());
  REQUIRE(snapshot_save(**f, path.c_str()).ok());
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(r.ok());
  check_retrains_alike(**f, **r);
}

TEST_CASE("damaged or misplaced queries sections are refused by every load") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/qs.snap", bad = dir + "/bad.snap";
  auto s = shown_after_training(rt.get(), SSA_PROXY_QPQ4);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  SnapshotImage base;
  base.bytes = read_file(path);
  REQUIRE(base.parse());
  const int q0 = base.find(snap::SectionKind::kQueries, 0), q1 = base.find(snap::SectionKind::kQueries, 1);
  REQUIRE(q0 >= 0);
  REQUIRE(q1 >= 0);
  const ssa_session_config c = qpq_file_config(SSA_PROXY_QPQ4);
  REQUIRE(base.entries[size_t(q0)].length == snap::query_moments_bytes(c));
  const uint32_t d = c.head_dim;
  const size_t sum_off = c.n_kv_heads * sizeof(uint64_t);
  {
    INFO("fewer queries than the codebooks were trained from");
    SnapshotImage img = base;
    // KV head 0 of layer 0: 39 observed, the last 39 kept (the rows after them zeroed).
    const size_t recent_count_off = sum_off + sizeof(double) * size_t{c.n_kv_heads} * d * d;
    const size_t recent_off = recent_count_off + c.n_kv_heads * sizeof(uint64_t);
    snap::put_u64(img.body(size_t(q0)), 2 * 20 - 1);
    snap::put_u64(img.body(size_t(q0)) + recent_count_off, 2 * 20 - 1);
    memset(img.body(size_t(q0)) + recent_off + sizeof(float) * (2 * 20 - 1) * d, 0,
           sizeof(float) * (kRecentQueries - (2 * 20 - 1)) * d);
    img.rehash(size_t(q0));
    check_refused_by_every_load(rt.get(), img, bad, {"fewer than the", "trained from"});
  }
  {
    INFO("a moment sum NaN");
    SnapshotImage img = base;
    const double nan = NAN;
    memcpy(img.body(size_t(q1)) + sum_off + 8 * (d + 1), &nan, 8);
    img.rehash(size_t(q1));
    check_refused_by_every_load(rt.get(), img, bad, {"query moments"});
  }
  {
    INFO("a second queries section for a layer");
    SnapshotImage img = base;
    append_section(img, base, size_t(q1));
    check_refused_by_every_load(rt.get(), img, bad, {"second one"});
  }
  {
    INFO("one byte short");
    SnapshotImage img = base;
    img.entries[size_t(q1)].length -= 1;
    img.rehash(size_t(q1));
    check_refused_by_every_load(rt.get(), img, bad, {"bytes, expected"});
  }
  {
    INFO("in a version 4 file");
    SnapshotImage img = base;
    img.sb.format_version = 4;
    check_refused_by_every_load(rt.get(), img, bad, {"format version 4"});
  }
  {
    INFO("in a file of a proxy that learns no queries");
    const std::string pq_path = dir + "/pq.snap";
    ssa_session_config pc = qpq_file_config(SSA_PROXY_QPQ4);
    pc.proxy = SSA_PROXY_PQ4;
    SnapshotImage img = saved_image(rt.get(), pc, pq_path);
    REQUIRE(img.find(snap::SectionKind::kQueries) < 0);
    append_section(img, base, size_t(q1));
    check_refused_by_every_load(rt.get(), img, bad, {"learns no queries"});
  }
}

// tests/snapshot/data/v4_qpq_f16.ssa was written by the version 4 library: 2
// layers, 4 q / 2 KV heads, head dim 32, f16, SSA_PROXY_QPQ of 8 subspaces x 16
// centroids, page_tokens 16, index_min_tokens 64, train sample 256, 2
// iterations, model fingerprint 0x0B0B0004; layer l shown 20 + l random queries
// (4 leading dimensions of scale 3, the rest 0.5), 70 random tokens appended to
// each layer, the index updated, then layer 0 shown 3 more queries (which a
// version 4 file does not hold).
TEST_CASE("version 4 query-aware files load with the queries their codebooks were trained from") {
  auto rt = make_runtime();
  const std::string dir = temp_dir();
  const std::string path = load_fixture_every_way(rt.get(), dir, "v4_qpq_f16.ssa", 4, SSA_PROXY_QPQ, 0x0B0B0004ull,
                                                  [](uint32_t l, const LayerStore& layer) {
                                                    const QueryMoments* qm = layer.query_moments.get();
                                                    REQUIRE(qm != nullptr);
                                                    CHECK(qm == layer.codebooks->trained_moments.get());
                                                    CHECK(qm->count[0] == 2 * (20 + l));
                                                    CHECK(qm->recent_count[0] == 2 * (20 + l));
                                                  });
  // Shown new queries, a checkpoint writes version 5 with them; loaded, it retrains alike.
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(r.ok());
  std::mt19937_64 rng(65);
  const std::vector<uint8_t> q = random_queries(**r, 5, rng);
  REQUIRE(session_observe_queries(**r, 1, q.data(), 5).ok());
  REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
  SnapshotImage img;
  img.bytes = read_file(path);
  REQUIRE(img.parse());
  CHECK(img.sb.format_version == snap::kFormatVersion);
  CHECK(img.find(snap::SectionKind::kQueries, 1) >= 0);
  absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
  REQUIRE(again.ok());
  check_retrains_alike(**r, **again);
}
