// The session store: paging, appends in pieces, copy-on-write forks, truncation,
// the index policy, and all-or-nothing behaviour under allocation failure.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "alloc.h"
#include "index/pq_index.h"
#include "session.h"
#include "support/session_helpers.h"
#include "support/structured_context.h"

using namespace ssa_test;

namespace {

struct Fixture {
  RuntimePtr rt = make_runtime(2);
  static constexpr uint32_t d = 64, nq = 4, nkv = 2;
  StructuredContext ctx = make_structured_context(6000, nkv, nq, d);

  SessionPtr session(uint32_t page_tokens = 64, uint32_t layers = 2) {
    auto c = make_config(layers, nq, nkv, d, SSA_DTYPE_F16);
    c.page_tokens = page_tokens;
    c.index_min_tokens = 1000;
    return make_session(rt.get(), c);
  }
  // Rows [t0, t1) of the context, token-major.
  std::vector<float> rows(const std::vector<float>& a, size_t t0, size_t t1) const {
    return std::vector<float>(a.begin() + t0 * nkv * d, a.begin() + t1 * nkv * d);
  }
  void append(ssa_session* s, uint32_t layer, size_t t0, size_t t1) const {
    append_f32(s, layer, rows(ctx.K, t0, t1), rows(ctx.V, t0, t1), t1 - t0, SSA_DTYPE_F16);
  }
  std::vector<float> decode(ssa_session* s, ssa_method m, uint32_t layer = 0) const {
    auto p = params(m, 0, 10.0f);
    p.n_sink = p.n_local = 32;
    return run_decode(s, layer, ctx.q, SSA_DTYPE_F16, p);
  }
};

uint64_t layer_tokens(ssa_session* s, uint32_t l) { return ssa_session_layer_length(s, l); }

}  // namespace

TEST_CASE_FIXTURE(Fixture, "appending in pieces equals one append; length is the minimum over layers") {
  auto one = session();
  auto pieces = session();
  append(one.get(), 0, 0, 6000);
  size_t t = 0;
  std::mt19937 rng(1);
  while (t < 6000) {
    const size_t step = std::min<size_t>(6000 - t, 1 + rng() % 700);
    append(pieces.get(), 0, t, t + step);
    t += step;
  }
  CHECK(ssa_session_length(one.get()) == 0);  // layer 1 is still empty
  CHECK(layer_tokens(one.get(), 0) == 6000);
  append(one.get(), 1, 0, 10);
  CHECK(ssa_session_length(one.get()) == 10);
  // Pieces trained their index at a different length: compare exact methods only,
  // and a proxy method after both retrain on the same keys.
  CHECK(decode(one.get(), SSA_METHOD_DENSE) == decode(pieces.get(), SSA_METHOD_DENSE));
  CHECK(decode(one.get(), SSA_METHOD_ORACLE_TOPK) == decode(pieces.get(), SSA_METHOD_ORACLE_TOPK));
  SSA_CHECK_OK(ssa_session_update_index(one.get()));
  SSA_CHECK_OK(ssa_session_update_index(pieces.get()));
  CHECK(decode(one.get(), SSA_METHOD_SSA) == decode(pieces.get(), SSA_METHOD_SSA));
}

TEST_CASE_FIXTURE(Fixture, "fork shares pages copy-on-write and the copies evolve independently") {
  auto a = session(64, 1);
  append(a.get(), 0, 0, 3000);  // 3000 = 46 full pages + a partial one
  const auto before = decode(a.get(), SSA_METHOD_SSA);
  const size_t live_before = a->kv_pool->live_pages();
  ssa_session* raw = nullptr;
  SSA_CHECK_OK(ssa_session_fork(a.get(), &raw));
  SessionPtr b(raw);
  CHECK(a->kv_pool->live_pages() == live_before);  // nothing copied by the fork
  CHECK(decode(b.get(), SSA_METHOD_SSA) == before);

  // Each grows differently; the shared partial page is copied on first write.
  append(a.get(), 0, 3000, 3500);
  append(b.get(), 0, 4000, 4100);
  CHECK(layer_tokens(a.get(), 0) == 3500);
  CHECK(layer_tokens(b.get(), 0) == 3100);

  // b equals a session built from the same rows directly.
  auto direct = session(64, 1);
  append(direct.get(), 0, 0, 3000);
  append(direct.get(), 0, 4000, 4100);
  CHECK(decode(b.get(), SSA_METHOD_DENSE) == decode(direct.get(), SSA_METHOD_DENSE));
  // Truncating a back to the fork point restores the original output exactly.
  SSA_CHECK_OK(ssa_session_truncate(a.get(), 3000));
  CHECK(decode(a.get(), SSA_METHOD_SSA) == before);
}

TEST_CASE_FIXTURE(Fixture, "truncate keeps a prefix that decodes like a fresh session of it") {
  auto a = session(64, 2);
  append(a.get(), 0, 0, 5000);
  append(a.get(), 1, 0, 4000);
  CHECK(ssa_session_truncate(a.get(), 4001) == SSA_ERR_INVALID_ARGUMENT);  // > length 4000
  CHECK(layer_tokens(a.get(), 0) == 5000);
  SSA_CHECK_OK(ssa_session_truncate(a.get(), 2500));
  CHECK(layer_tokens(a.get(), 0) == 2500);
  CHECK(layer_tokens(a.get(), 1) == 2500);
  auto fresh = session(64, 2);
  append(fresh.get(), 0, 0, 2500);
  CHECK(decode(a.get(), SSA_METHOD_DENSE) == decode(fresh.get(), SSA_METHOD_DENSE));
  // Grow again after truncation: rows beyond the cut were really dropped.
  append(a.get(), 0, 3000, 3100);
  append(fresh.get(), 0, 3000, 3100);
  CHECK(decode(a.get(), SSA_METHOD_DENSE) == decode(fresh.get(), SSA_METHOD_DENSE));
}

TEST_CASE_FIXTURE(Fixture, "index policy: trains at index_min_tokens and again after regrowing") {
  auto c = make_config(1, nq, nkv, d, SSA_DTYPE_F16);
  c.index_min_tokens = 1000;
  c.index_regrow_factor = 2.0f;
  auto s = make_session(rt.get(), c);
  auto trained_at = [&]() {
    std::shared_lock lock(s->mu);
    return s->layers[0].codebooks ? s->layers[0].trained_at_tokens : 0;
  };
  append(s.get(), 0, 0, 999);
  CHECK(trained_at() == 0);
  append(s.get(), 0, 999, 1000);
  CHECK(trained_at() == 1000);
  append(s.get(), 0, 1000, 1999);
  CHECK(trained_at() == 1000);
  append(s.get(), 0, 1999, 2100);
  CHECK(trained_at() == 2100);
  SSA_CHECK_OK(ssa_session_truncate(s.get(), 500));
  SSA_CHECK_OK(ssa_session_update_index(s.get()));
  CHECK(trained_at() == 500);
}

TEST_CASE_FIXTURE(Fixture, "proxy methods train an index on demand below index_min_tokens") {
  auto c = make_config(1, nq, nkv, d, SSA_DTYPE_F16);
  c.index_min_tokens = 100000;
  auto s = make_session(rt.get(), c);
  append(s.get(), 0, 0, 4000);
  {
    std::shared_lock lock(s->mu);
    CHECK(s->layers[0].codebooks == nullptr);
  }
  const auto out = decode(s.get(), SSA_METHOD_SSA);
  std::shared_lock lock(s->mu);
  CHECK(s->layers[0].codebooks != nullptr);
  CHECK(s->layers[0].code_pages.size() == s->layers[0].kv_pages.size());
}

// Appends encode their tokens with the encoder the session keeps per layer; it
// must follow the layer's codebooks through a retraining. Every code of the layer
// is compared with a fresh encoding of all its keys under its current codebooks.
TEST_CASE_FIXTURE(Fixture, "appended tokens get the codes of the layer's current codebooks, also after retraining") {
  auto s = session(16, 1);
  auto check_codes = [&](const char* when) {
    std::shared_lock lock(s->mu);
    const ssa::LayerStore& l = s->layers[0];
    REQUIRE(l.codebooks != nullptr);
    auto fresh = ssa::encode_layer(s->layout, l.codebooks, s->config.pq_parallel_weight, l, *s->code_pool,
                                   *s->rt->pool);
    REQUIRE(fresh.ok());
    size_t differ = 0;
    for (uint64_t t = 0; t < l.n_tokens; ++t) {
      const uint64_t page = t / s->layout.page_tokens;
      const uint32_t slot = static_cast<uint32_t>(t % s->layout.page_tokens);
      for (uint32_t h = 0; h < nkv; ++h)
        for (uint32_t m = 0; m < s->layout.pq_subspaces; ++m) {
          const size_t at = s->layout.code_offset(h, m) + slot;
          differ += l.code_pages[page]->data()[at] != (*fresh)[page]->data()[at];
        }
    }
    INFO(when);
    CHECK(differ == 0);
  };
  append(s.get(), 0, 0, 1500);  // trained at 1000 tokens
  for (size_t t = 1500; t < 1540; ++t) append(s.get(), 0, t, t + 1);
  append(s.get(), 0, 1540, 1600);
  check_codes("one-token appends with the first codebooks");
  const ssa::PqCodebooks* before = nullptr;
  {
    std::shared_lock lock(s->mu);
    before = s->layers[0].codebooks.get();
  }
  REQUIRE(ssa_session_update_index(s.get()) == SSA_OK);
  {
    std::shared_lock lock(s->mu);
    REQUIRE(s->layers[0].codebooks.get() != before);
  }
  for (size_t t = 1600; t < 1640; ++t) append(s.get(), 0, t, t + 1);
  check_codes("one-token appends after retraining");
}

TEST_CASE_FIXTURE(Fixture, "allocation failure at every point leaves the session unchanged") {
  auto s = session(64, 1);
  append(s.get(), 0, 0, 1500);  // trained, partial last page
  ssa_session* raw = nullptr;
  SSA_CHECK_OK(ssa_session_fork(s.get(), &raw));  // the partial page is shared: append must copy
  SessionPtr fork(raw);
  const auto before = decode(s.get(), SSA_METHOD_SSA);
  int failures = 0;
  for (uint64_t nth = 1; nth < 200; ++nth) {
    const auto kb = encode(rows(ctx.K, 1500, 2100), SSA_DTYPE_F16);
    const auto vb = encode(rows(ctx.V, 1500, 2100), SSA_DTYPE_F16);
    ssa::set_alloc_failure_countdown(nth, true);
    const ssa_status st = ssa_session_append(s.get(), 0, kb.data(), vb.data(), 600);
    ssa::set_alloc_failure_countdown(0, false);
    if (st == SSA_OK) break;  // past the last allocation
    ++failures;
    CHECK(st == SSA_ERR_OUT_OF_MEMORY);
    CHECK(std::string(ssa_last_error_message()).find("allocate") != std::string::npos);
    CHECK(layer_tokens(s.get(), 0) == 1500);
    CHECK(decode(s.get(), SSA_METHOD_SSA) == before);
    CHECK(decode(fork.get(), SSA_METHOD_SSA) == before);
  }
  CHECK(failures >= 3);  // COW copies, new KV pages, new code pages all failed once
  CHECK(layer_tokens(s.get(), 0) == 2100);
  CHECK(decode(fork.get(), SSA_METHOD_SSA) == before);  // the fork never saw the append
}
