// The snapshot entry points through the public header and shared library only:
// statuses, messages, metadata semantics, inspect, the expected-shape check.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ssa.h"

namespace {

struct Fixture {
  ssa_runtime* rt = nullptr;
  ssa_session* s = nullptr;
  ssa_session_config cfg;
  std::string dir;
  Fixture() {
    char tmpl[] = "/tmp/ssa_snapshot_capi.XXXXXX";
    dir = mkdtemp(tmpl);
    REQUIRE(ssa_runtime_create(nullptr, &rt) == SSA_OK);
    ssa_session_config_init(&cfg);
    cfg.n_layers = 2;
    cfg.n_q_heads = 4;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.kv_dtype = SSA_DTYPE_F32;
    cfg.page_tokens = 16;
    cfg.model_fingerprint = 0x1234;
    REQUIRE(ssa_session_create(rt, &cfg, &s) == SSA_OK);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    const uint64_t n = 50;
    std::vector<float> k(n * 2 * 64), v(k.size());
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    for (uint32_t l = 0; l < 2; ++l) REQUIRE(ssa_session_append(s, l, k.data(), v.data(), n) == SSA_OK);
  }
  ~Fixture() {
    ssa_session_destroy(s);
    ssa_runtime_destroy(rt);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::vector<float> decode_out(ssa_session* s) {
  std::vector<float> q(4 * 64), out(4 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 7) * 0.25f - 0.7f;
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = SSA_METHOD_DENSE;
  REQUIRE(ssa_decode(s, 1, q.data(), out.data(), &p, nullptr) == SSA_OK);
  return out;
}

}  // namespace

TEST_CASE("metadata: copy in, size query, copy out") {
  Fixture f;
  size_t n = 99;
  CHECK(ssa_session_get_metadata(f.s, nullptr, 0, &n) == SSA_OK);
  CHECK(n == 0);
  const char meta[] = "conversation 7, turn 3";
  CHECK(ssa_session_set_metadata(f.s, meta, sizeof meta) == SSA_OK);
  char small[4] = {'x', 'x', 'x', 'x'};
  CHECK(ssa_session_get_metadata(f.s, small, sizeof small, &n) == SSA_OK);
  CHECK(n == sizeof meta);
  CHECK(small[0] == 'x');  // too small: nothing written
  std::vector<char> buf(n);
  CHECK(ssa_session_get_metadata(f.s, buf.data(), buf.size(), &n) == SSA_OK);
  CHECK(memcmp(buf.data(), meta, sizeof meta) == 0);
  CHECK(ssa_session_set_metadata(f.s, nullptr, 5) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(strlen(ssa_last_error_message()) > 0);
  CHECK(ssa_session_set_metadata(nullptr, meta, 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_get_metadata(f.s, nullptr, 4, &n) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_get_metadata(f.s, buf.data(), buf.size(), nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_set_metadata(f.s, nullptr, 0) == SSA_OK);
  CHECK(ssa_session_get_metadata(f.s, nullptr, 0, &n) == SSA_OK);
  CHECK(n == 0);
}

TEST_CASE("save, inspect, load and checked load through the C API") {
  Fixture f;
  const std::string path = f.dir + "/c.snap";
  CHECK(ssa_session_set_metadata(f.s, "abc", 3) == SSA_OK);
  REQUIRE(ssa_session_save(f.s, path.c_str()) == SSA_OK);
  CHECK(strcmp(ssa_last_error_message(), "") == 0);

  ssa_snapshot_info info;
  ssa_snapshot_info_init(&info);
  CHECK(info.struct_size == sizeof info);
  REQUIRE(ssa_snapshot_inspect(path.c_str(), &info) == SSA_OK);
  CHECK(info.length == 50);
  CHECK(info.model_fingerprint == 0x1234);
  CHECK(info.kv_dtype == SSA_DTYPE_F32);
  CHECK(info.metadata_bytes == 3);
  CHECK(info.generation == 1);

  const std::vector<float> want = decode_out(f.s);
  for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP}) {
    ssa_session* back = nullptr;
    REQUIRE(ssa_session_load(f.rt, path.c_str(), flags, &back) == SSA_OK);
    CHECK(ssa_session_length(back) == 50);
    CHECK(decode_out(back) == want);
    char m[3];
    size_t n = 0;
    CHECK(ssa_session_get_metadata(back, m, 3, &n) == SSA_OK);
    CHECK(std::string(m, n) == "abc");
    ssa_session_destroy(back);
  }

  ssa_session* out = nullptr;
  REQUIRE(ssa_session_load_checked(f.rt, path.c_str(), 0, &f.cfg, &out) == SSA_OK);
  ssa_session_destroy(out);
  out = nullptr;
  ssa_session_config other = f.cfg;
  other.model_fingerprint = 99;
  CHECK(ssa_session_load_checked(f.rt, path.c_str(), 0, &other, &out) == SSA_ERR_MISMATCH);
  CHECK(out == nullptr);
  CHECK(strstr(ssa_last_error_message(), "fingerprint") != nullptr);
  other = f.cfg;
  other.n_kv_heads = 1;
  CHECK(ssa_session_load_checked(f.rt, path.c_str(), 0, &other, &out) == SSA_ERR_MISMATCH);
  CHECK(strstr(ssa_last_error_message(), "n_kv_heads") != nullptr);

  // Checkpoint after more tokens, and the error paths.
  std::vector<float> k(10 * 2 * 64, 0.5f), v(k.size(), -0.25f);
  for (uint32_t l = 0; l < 2; ++l) REQUIRE(ssa_session_append(f.s, l, k.data(), v.data(), 10) == SSA_OK);
  REQUIRE(ssa_session_checkpoint(f.s, path.c_str()) == SSA_OK);
  REQUIRE(ssa_snapshot_inspect(path.c_str(), &info) == SSA_OK);
  CHECK(info.generation == 2);
  CHECK(info.length == 60);

  CHECK(ssa_session_load(f.rt, (f.dir + "/missing").c_str(), 0, &out) == SSA_ERR_IO);
  CHECK(strstr(ssa_last_error_message(), "missing") != nullptr);
  CHECK(ssa_session_load(f.rt, path.c_str(), 0, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_load(nullptr, path.c_str(), 0, &out) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_save(nullptr, path.c_str()) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_save(f.s, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_snapshot_inspect(path.c_str(), nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_save(f.s, "/proc/not_writable.snap") == SSA_ERR_IO);
  const std::string junk = f.dir + "/junk";
  FILE* fp = fopen(junk.c_str(), "wb");
  fputs("definitely not a snapshot", fp);
  fclose(fp);
  CHECK(ssa_session_load(f.rt, junk.c_str(), 0, &out) == SSA_ERR_CORRUPT);
  CHECK(ssa_snapshot_inspect(junk.c_str(), &info) == SSA_ERR_CORRUPT);
  CHECK(strstr(ssa_last_error_message(), "magic") != nullptr);
  CHECK(out == nullptr);
}
