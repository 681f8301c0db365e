// Helpers shared by the snapshot tests and the fuzzer, over the internal API: random
// sessions, byte-exact store comparison, decode comparison, file helpers.
#pragma once

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "cpu/thread_pool.h"
#include "decode/decode.h"
#include "runtime.h"
#include "session.h"
#include "snapshot/snapshot.h"
#include "status.h"
#include "support/config.h"
#include "support/handles.h"

namespace ssa::test {

// One worker by default: nothing but the caller runs when a test forks.
inline ssa_test::RuntimePtr make_runtime(int threads = 1) { return ssa_test::make_runtime(threads, 0x5EED); }

// Two small layers, 16-token pages and a 16-centroid index trained at 64 tokens,
// so that a few hundred tokens exercise pages, codes and codebooks.
inline ssa_session_config small_config(uint64_t fingerprint = 0xF00DF00Dull) {
  ssa_session_config c = ssa_test::make_config(2, 4, 2, 64, SSA_DTYPE_F16);
  c.pq_centroids = 16;
  c.model_fingerprint = fingerprint;
  c.page_tokens = 16;
  c.index_min_tokens = 64;
  c.index_train_sample = 256;
  c.index_iterations = 2;
  return c;
}

// Random non-zero K/V rows for n tokens of one layer.
inline std::vector<uint8_t> random_rows(const ssa_session& s, uint64_t n, std::mt19937_64& rng) {
  const KvLayout& L = s.layout;
  const size_t elems = n * L.n_kv_heads * L.head_dim;
  std::vector<uint8_t> out(elems * L.elem_bytes());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < elems; ++i) {
    float v = nd(rng);
    if (v == 0.0f) v = 0.5f;
    store_from_f32(out.data(), L.dtype, i, v);
  }
  return out;
}

inline absl::Status append_random(ssa_session& s, uint32_t layer, uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> k = random_rows(s, n, rng), v = random_rows(s, n, rng);
  return session_append(s, layer, k.data(), v.data(), n);
}

inline absl::Status append_all_layers(ssa_session& s, uint64_t n, std::mt19937_64& rng) {
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) SSA_RETURN_IF_ERROR(append_random(s, l, n, rng));
  return absl::OkStatus();
}

inline std::unique_ptr<ssa_session> make_session(ssa_runtime* rt, const ssa_session_config& cfg,
                                                 uint64_t tokens, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<ssa_session>> s = create_session(rt, cfg);
  if (!s.ok()) return nullptr;
  std::mt19937_64 rng(seed);
  if (!append_all_layers(**s, tokens, rng).ok()) return nullptr;
  return *std::move(s);
}

// Calls fn(offset, length) for each byte range of a page that holds visible
// tokens (the first `valid` slots); the rest of a partial page is not content.
template <typename Fn>
void for_each_visible(const KvLayout& L, bool kv, uint32_t valid, Fn&& fn) {
  if (kv) {
    for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
      fn(L.k_offset(h, 0), valid * L.row_bytes());
      fn(L.v_offset(h, 0), valid * L.row_bytes());
    }
  } else {
    for (uint32_t h = 0; h < L.n_kv_heads; ++h)
      for (uint32_t r = 0; r < L.code_rows(); ++r) fn(L.code_offset(h, r), size_t{valid});
  }
}

inline bool visible_equal(const KvLayout& L, bool kv, uint32_t valid, const uint8_t* a,
                          const uint8_t* b) {
  bool same = true;
  for_each_visible(L, kv, valid, [&](size_t off, size_t len) {
    same = same && memcmp(a + off, b + off, len) == 0;
  });
  return same;
}

inline uint32_t valid_in_page(const KvLayout& L, uint64_t n_tokens, uint64_t page) {
  const uint64_t left = n_tokens - page * L.page_tokens;
  return static_cast<uint32_t>(left < L.page_tokens ? left : L.page_tokens);
}

// Empty string when the two stores are byte for byte the same (visible rows of codes, codebooks, lengths, config, metadata); else what differs.
inline std::string store_diff(const ssa_session& a, const ssa_session& b) {
  std::shared_lock la(a.mu);
  std::shared_lock lb(b.mu);
  if (memcmp(&a.config, &b.config, sizeof a.config) != 0) return "config differs";
  if (a.metadata != b.metadata) return "metadata differs";
  if (a.layers.size() != b.layers.size()) return "layer count differs";
  const KvLayout& L = a.layout;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerStore &x = a.layers[l], &y = b.layers[l];
    const std::string at = " in layer " + std::to_string(l);
    if (x.n_tokens != y.n_tokens) return "n_tokens differs" + at;
    if (x.trained_at_tokens != y.trained_at_tokens) return "trained_at_tokens differs" + at;
    const uint64_t pages = L.pages_for(x.n_tokens);
    if (x.kv_pages.size() < pages || y.kv_pages.size() < pages) return "missing KV pages" + at;
    for (uint64_t p = 0; p < pages; ++p) {
      if (!visible_equal(L, true, valid_in_page(L, x.n_tokens, p), x.kv_pages[p]->data(),
                         y.kv_pages[p]->data()))
        return "KV page " + std::to_string(p) + " differs" + at;
    }
    if ((x.codebooks == nullptr) != (y.codebooks == nullptr)) return "index presence differs" + at;
    if (x.codebooks) {
      if (x.codebooks->data.size() != y.codebooks->data.size() ||
          memcmp(x.codebooks->data.data(), y.codebooks->data.data(),
                 x.codebooks->data.size() * sizeof(float)) != 0)
        return "codebooks differ" + at;
      if (x.codebooks->rotation != y.codebooks->rotation) return "rotations differ" + at;
      if (x.code_pages.size() < pages || y.code_pages.size() < pages) return "missing code pages" + at;
      for (uint64_t p = 0; p < pages; ++p) {
        if (!visible_equal(L, false, valid_in_page(L, x.n_tokens, p), x.code_pages[p]->data(),
                           y.code_pages[p]->data()))
          return "code page " + std::to_string(p) + " differs" + at;
      }
    }
  }
  return "";
}

// Decodes every layer with a few methods at a fixed seed/step; the outputs, bytes.
inline std::vector<uint8_t> decode_fingerprint(ssa_session& s, uint64_t seed) {
  const KvLayout& L = s.layout;
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> all;
  const ssa_method methods[] = {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK};
  for (uint32_t l = 0; l < L.n_layers; ++l) {
    std::vector<uint8_t> q(size_t{L.n_q_heads} * L.head_dim * L.elem_bytes());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (size_t i = 0; i < size_t{L.n_q_heads} * L.head_dim; ++i) store_from_f32(q.data(), L.dtype, i, nd(rng));
    bool indexed;
    {
      std::shared_lock lock(s.mu);
      indexed = s.layers[l].codebooks != nullptr;
    }
    for (ssa_method m : methods) {
      if (!indexed && m != SSA_METHOD_DENSE) continue;  // would train (change) the session
      ssa_decode_params p = ssa_test::params(m, 0, 4.0f);
      p.n_sink = 4;
      p.n_local = 4;
      p.seed = 1234;
      p.step = 7;
      std::vector<uint8_t> out(q.size());
      absl::Status st = decode(s, l, q.data(), out.data(), p, nullptr);
      if (!st.ok()) {
        const std::string msg(st.message());
        all.insert(all.end(), msg.begin(), msg.end());
        continue;
      }
      all.insert(all.end(), out.begin(), out.end());
    }
  }
  return all;
}

inline uint64_t session_length(const ssa_session& s) {
  std::shared_lock lock(s.mu);
  return session_length_locked(s);
}

// A fresh directory under /tmp, removed with its contents when the process exits
// normally (children that _exit leave it to the parent).
inline std::string temp_dir() {
  static std::vector<std::string>* dirs = [] {
    auto* v = new std::vector<std::string>;
    atexit([] {
      for (const std::string& d : *dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    });
    return v;
  }();
  char tmpl[] = "/tmp/ssa_snapshot_test.XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (d == nullptr) return "/tmp";
  dirs->push_back(d);
  return d;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> out;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return out;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  fclose(f);
  return out;
}

inline bool write_file(const std::string& path, const void* data, size_t n) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = n == 0 || fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

inline uint64_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The entries of a folder but . and .., sorted (empty if it cannot be read).
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.push_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ssa::test
