// The proxy in snapshots (format version 2): an OPQ session round-trips with its
// rotations, every loaded rotation is checked (finite, orthogonal, sized for the
// config), damage to the new bytes is refused or harmless, and version 1 files,
// which hold no proxy, still load as PQ.
#include <doctest/doctest.h>
#include <math.h>

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
  CHECK(info.format_version == 2);
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
    for (uint32_t v : {0u, 1u, 2u, 7u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
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
        // Another known proxy changes the codebooks' length; others are unknown.
        REQUIRE(!r.ok());
        CHECK(status_code(r.status()) == SSA_ERR_CORRUPT);
        CHECK(std::string(r.status().message()).find(v <= 1 ? "codebooks" : "proxy") != std::string::npos);
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
  // A checkpoint of the loaded session must not leave a version 2 superblock
  // over the version 1 config: it rewrites the file whole.
  absl::StatusOr<std::unique_ptr<ssa_session>> r = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(r.ok());
  std::mt19937_64 rng(11);
  REQUIRE(append_all_layers(**r, 20, rng).ok());
  REQUIRE(snapshot_checkpoint(**r, path.c_str()).ok());
  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  REQUIRE(snapshot_inspect(path.c_str(), &info).ok());
  CHECK(info.format_version == 2);
  absl::StatusOr<std::unique_ptr<ssa_session>> again = snapshot_load(rt.get(), path.c_str(), 0);
  REQUIRE(again.ok());
  CHECK(store_diff(**r, **again) == "");
}

TEST_CASE("the committed version 1 corpus files still load, as PQ sessions") {
  auto rt = make_runtime();
  const std::string dir = SSA_FUZZ_CORPUS_DIR;
  int loaded = 0;
  for (const std::string& f : list_dir(dir)) {
    // valid_row_runs_*: written by a version 2 writer (checkpoints with row runs).
    if (f.rfind("valid_", 0) != 0 || f.rfind("valid_row_runs_", 0) == 0) continue;
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
