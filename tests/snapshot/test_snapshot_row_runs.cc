// Row runs: a checkpoint writes the rows a turn added, not the partial pages they
// landed in again. Bytes written against the turn's own K/V + codes across page
// boundaries and layer counts, loads equal to a full save's byte for byte, and
// checkpoints continuing from a loaded file.
#include <doctest/doctest.h>

#include <stdio.h>

#include <random>
#include <string>

#include "snapshot/format.h"
#include "support/snapshot_helpers.h"
#include "support/snapshot_load.h"

using namespace ssa;
using namespace ssa::test;

namespace {

// Bytes this process has passed to write() and pwrite() so far, or -1.
int64_t written_bytes() {
  FILE* f = fopen("/proc/self/io", "r");
  if (f == nullptr) return -1;
  char key[64];
  long long v = 0;
  int64_t out = -1;
  while (fscanf(f, "%63s %lld", key, &v) == 2) {
    if (std::string(key) == "wchar:") out = v;
  }
  fclose(f);
  return out;
}

ssa_session_config config_with(uint32_t layers, uint32_t page_tokens) {
  ssa_session_config c = small_config();
  c.n_layers = layers;
  c.page_tokens = page_tokens;
  c.index_regrow_factor = 0.0f;  // no retrain in the middle of a measurement
  return c;
}

// K/V + codes of n new tokens over all layers (every layer indexed).
uint64_t turn_bytes(const ssa_session& s, uint64_t n) {
  const KvLayout& L = s.layout;
  return n * L.n_layers * (L.kv_page_bytes() + L.code_page_bytes()) / L.page_tokens;
}

// Every page of every layer below its length, whole (tail slots included).
std::string whole_pages_diff(const ssa_session& a, const ssa_session& b) {
  std::shared_lock la(a.mu);
  std::shared_lock lb(b.mu);
  const KvLayout& L = a.layout;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerStore &x = a.layers[l], &y = b.layers[l];
    if (x.n_tokens != y.n_tokens) return "lengths differ in layer " + std::to_string(l);
    for (uint64_t p = 0; p < L.pages_for(x.n_tokens); ++p) {
      if (memcmp(x.kv_pages[p]->data(), y.kv_pages[p]->data(), L.kv_page_bytes()) != 0)
        return "KV page " + std::to_string(p) + " of layer " + std::to_string(l);
      if (x.codebooks && memcmp(x.code_pages[p]->data(), y.code_pages[p]->data(), L.code_page_bytes()) != 0)
        return "code page " + std::to_string(p) + " of layer " + std::to_string(l);
    }
  }
  return "";
}

void check_equals_full_save(ssa_runtime* rt, ssa_session& s, const std::string& ckpt, const std::string& dir) {
  const std::string full = dir + "/full.snap";
  REQUIRE(snapshot_save(s, full.c_str()).ok());
  for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP, SSA_LOAD_MMAP | SSA_LOAD_VERIFY}) {
    CAPTURE(flags);
    auto a = load_ok(rt, ckpt, flags);
    auto b = load_ok(rt, full, flags);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(store_diff(s, *a) == "");
    CHECK(whole_pages_diff(*a, *b) == "");
  }
}

}  // namespace

TEST_CASE("a checkpoint writes about the new rows' K/V + codes across page boundaries") {
  auto rt = make_runtime();
  const std::string dir = temp_dir();
  for (uint32_t layers : {1u, 3u, 6u}) {
    for (uint32_t P : {16u, 64u}) {
      for (uint64_t start : {uint64_t{100}, uint64_t{4} * P}) {  // a partial and a full last page
        for (uint64_t n : {uint64_t{1}, uint64_t{P - 1}, uint64_t{P}, uint64_t{P + 1}, uint64_t{7} * P + 5}) {
          CAPTURE(layers);
          CAPTURE(P);
          CAPTURE(start);
          CAPTURE(n);
          const std::string path = dir + "/r.snap";
          auto s = make_session(rt.get(), config_with(layers, P), start, layers * 1000 + P + n);
          REQUIRE(s);
          REQUIRE(session_update_index(*s).ok());
          REQUIRE(snapshot_save(*s, path.c_str()).ok());
          std::mt19937_64 rng(n);
          REQUIRE(append_all_layers(*s, n, rng).ok());
          const uint64_t size0 = file_size(path);
          const int64_t w0 = written_bytes();
          REQUIRE(snapshot_checkpoint(*s, path.c_str()).ok());
          const int64_t w1 = written_bytes();
          // Written: the file's growth plus the superblock slot; /proc/self/io when there.
          const uint64_t wrote = w0 >= 0 && w1 >= 0 ? static_cast<uint64_t>(w1 - w0)
                                                    : file_size(path) - size0 + snap::kSuperblockBytes;
          const uint64_t turn = turn_bytes(*s, n);
          // The constant: superblock, layers section, the table (a few entries per
          // layer in these files) and alignment below 512 bytes per section.
          const uint64_t constant = 8192 + uint64_t{layers} * 2048;
          CHECK(wrote >= turn);
          CHECK(static_cast<double>(wrote) <= 1.1 * static_cast<double>(turn) + static_cast<double>(constant));
          MESSAGE("layers " << layers << " page " << P << " start " << start << " +" << n << ": wrote " << wrote
                            << " for " << turn << " B of new K/V + codes");
          check_equals_full_save(rt.get(), *s, path, dir);
        }
      }
    }
  }
}

TEST_CASE("many small checkpoints, truncates and loads in between restore exactly") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/h.snap";
  ssa_session_config cfg = config_with(3, 16);
  auto s = make_session(rt.get(), cfg, 70, 3);
  REQUIRE(s);
  REQUIRE(session_update_index(*s).ok());
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  std::mt19937_64 rng(11);
  std::unique_ptr<ssa_session> cur = std::move(s);
  uint64_t turns_bytes = 0, written = 0;
  for (int t = 0; t < 40; ++t) {
    CAPTURE(t);
    const uint64_t n = 1 + rng() % 9;  // several turns fill one page
    REQUIRE(append_all_layers(*cur, n, rng).ok());
    if (t % 7 == 3) REQUIRE(session_truncate(*cur, session_length(*cur) - 5).ok());  // rewrites rows of a page
    const uint64_t size0 = file_size(path);
    REQUIRE(snapshot_checkpoint(*cur, path.c_str()).ok());
    if (t % 7 != 3) {
      turns_bytes += turn_bytes(*cur, n);
      written += file_size(path) - size0;
    }
    if (t % 5 == 4) {
      // A loaded session checkpoints on from what the file holds (row runs included).
      check_equals_full_save(rt.get(), *cur, path, dir);
      auto back = load_ok(rt.get(), path, t % 10 == 4 ? SSA_LOAD_MMAP : 0u);
      REQUIRE(back);
      cur = std::move(back);
    }
  }
  check_equals_full_save(rt.get(), *cur, path, dir);
  MESSAGE("40 turns of 1..9 tokens: the file grew " << written << " B for " << turns_bytes
                                                    << " B of new K/V + codes (the table grows with the turns)");
  CHECK(written >= turns_bytes);
}
