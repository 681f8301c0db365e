// Every size-carrying argument of append, append_async, truncate, decode and
// decode_batch, at and around its limit (the layer's token limit 2^32 - 1, and
// 2^31, 2^32, 2^63, the type's maximum): a size the call rejects is rejected
// before anything is read (the arrays here hold far fewer rows than the sizes
// claim, so a read past them fails under AddressSanitizer), with a status and a
// message, and nothing changes (the session decodes bitwise as before). Sizes
// the limits allow are not rejected as sizes.
#include <doctest/doctest.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "support/reference_attention.h"
#include "support/session_helpers.h"

using namespace ssa_test;

namespace {

constexpr uint32_t kLayers = 3, kQ = 4, kKv = 2, kD = 128;  // 256 elements per token
constexpr uint64_t kTokens = 120;                           // in layers 0 and 1; layer 2 is empty
constexpr uint64_t kLayerLimit = 0xFFFFFFFFull;             // ssa.h: at most 2^32 - 1 tokens a layer
constexpr uint64_t kRoom = kLayerLimit - kTokens;           // the most layers 0 and 1 can still take
constexpr size_t kTokenElems = size_t{kKv} * kD;

struct Fixture {
  RuntimePtr rt = make_runtime(2);
  SessionPtr s;
  std::vector<float> K, V, q;

  Fixture() {
    ssa_session_config c = make_config(kLayers, kQ, kKv, kD, SSA_DTYPE_F32);
    c.page_tokens = 16;
    s = make_session(rt.get(), c);
    K = random_vec(kTokens * kTokenElems, 11);
    V = random_vec(kTokens * kTokenElems, 12);
    q = random_vec(size_t{kQ} * kD, 13, 0.5f);
    for (uint32_t l = 0; l < 2; ++l) append_f32(s.get(), l, K, V, kTokens, SSA_DTYPE_F32);
  }

  // Dense decode of layer l, as bytes (compared bitwise before and after a refused call).
  std::vector<float> dense(uint32_t l) const {
    return run_decode(s.get(), l, q, SSA_DTYPE_F32, params(SSA_METHOD_DENSE));
  }

  void expect_unchanged(const std::vector<float>& before0, const std::vector<float>& before1) const {
    CHECK(ssa_session_layer_length(s.get(), 0) == kTokens);
    CHECK(ssa_session_layer_length(s.get(), 1) == kTokens);
    CHECK(ssa_session_layer_length(s.get(), 2) == 0);
    const std::vector<float> a0 = dense(0), a1 = dense(1);
    CHECK(memcmp(a0.data(), before0.data(), a0.size() * sizeof(float)) == 0);
    CHECK(memcmp(a1.data(), before1.data(), a1.size() * sizeof(float)) == 0);
  }

  // The f64 reference of dense attention over layer 0's rows, query head h.
  std::vector<double> reference(uint32_t h) const {
    const std::vector<double> k = head_rows(quantised(K, SSA_DTYPE_F32), kTokens, kKv, kD, h / (kQ / kKv));
    const std::vector<double> v = head_rows(quantised(V, SSA_DTYPE_F32), kTokens, kKv, kD, h / (kQ / kKv));
    std::vector<double> qh(q.begin() + size_t{h} * kD, q.begin() + size_t{h + 1} * kD);
    return dense_attention_f64(qh.data(), k.data(), v.data(), kTokens, kD);
  }
};

using AppendFn = ssa_status (*)(ssa_session*, uint32_t, const void*, const void*, uint64_t);
ssa_status append_sync(ssa_session* s, uint32_t l, const void* k, const void* v, uint64_t n) {
  return ssa_session_append(s, l, k, v, n);
}
ssa_status append_async(ssa_session* s, uint32_t l, const void* k, const void* v, uint64_t n) {
  return ssa_session_append_async(s, l, k, v, n, nullptr);
}
constexpr AppendFn kAppends[] = {append_sync, append_async};

bool message_has(const char* word) { return std::string(ssa_last_error_message()).find(word) != std::string::npos; }

// Every append, synchronous and asynchronous, of each count to each layer is
// refused with SSA_ERR_INVALID_ARGUMENT and a message holding `word`.
void expect_refused(ssa_session* s, std::initializer_list<uint32_t> layers, std::initializer_list<uint64_t> counts,
                    const void* k, const void* v, const char* word) {
  for (AppendFn append : kAppends) {
    for (uint32_t layer : layers) {
      for (uint64_t n : counts) {
        CAPTURE(layer);
        CAPTURE(n);
        CHECK(append(s, layer, k, v, n) == SSA_ERR_INVALID_ARGUMENT);
        CHECK(message_has(word));
      }
    }
  }
}

}  // namespace

TEST_CASE("append: a token count beyond the layer's room is refused before k or v is read") {
  Fixture f;
  const std::vector<float> before0 = f.dense(0), before1 = f.dense(1);
  // One token of K and V: every count below claims far more.
  const std::vector<float> k1 = random_vec(kTokenElems, 21), v1 = random_vec(kTokenElems, 22);
  expect_refused(f.s.get(), {0u, 1u},
                 {kRoom + 1, kRoom + 2, uint64_t{1} << 32, kLayerLimit, (uint64_t{1} << 32) + 1, uint64_t{1} << 63,
                  UINT64_MAX - kTokens + 1, UINT64_MAX},
                 k1.data(), v1.data(), "limit");
  // An empty layer takes up to the limit itself: one more is refused.
  expect_refused(f.s.get(), {2u}, {kLayerLimit + 1, uint64_t{1} << 63, UINT64_MAX}, k1.data(), v1.data(), "limit");
  f.expect_unchanged(before0, before1);
}

TEST_CASE("append: the largest token counts the limit allows pass the size checks") {
  // Such counts cannot be backed by real arrays here. With k[0] NaN the call
  // passes every size check and stops at the NaN/Inf scan, which reads k up to
  // the end of the 256-element block holding the first NaN; the arrays hold four
  // tokens (1024 elements), so nothing past them is read.
  Fixture f;
  const std::vector<float> before0 = f.dense(0), before1 = f.dense(1);
  std::vector<float> k4 = random_vec(4 * kTokenElems, 31), v4 = random_vec(4 * kTokenElems, 32);
  k4[0] = NAN;
  expect_refused(f.s.get(), {0u, 1u},
                 {kRoom, kRoom - 1, uint64_t{1} << 31, (uint64_t{1} << 31) - 1, (uint64_t{1} << 31) + 1},
                 k4.data(), v4.data(), "k[0] is NaN");
  // An empty layer: exactly the limit.
  expect_refused(f.s.get(), {2u}, {kLayerLimit}, k4.data(), v4.data(), "k[0] is NaN");
  f.expect_unchanged(before0, before1);
}

TEST_CASE("append: a layer index at or beyond n_layers is refused before k or v is read") {
  Fixture f;
  const std::vector<float> before0 = f.dense(0), before1 = f.dense(1);
  const std::vector<float> k1 = random_vec(kTokenElems, 41), v1 = random_vec(kTokenElems, 42);
  expect_refused(f.s.get(), {kLayers, kLayers + 1, 1u << 31, 0xFFFFFFFFu},
                 {uint64_t{1}, uint64_t{1} << 31, kLayerLimit, UINT64_MAX}, k1.data(), v1.data(), "n_layers");
  f.expect_unchanged(before0, before1);
}

TEST_CASE("truncate: a length above the session's is refused and changes nothing") {
  Fixture f;
  const std::vector<float> before0 = f.dense(0), before1 = f.dense(1);
  // The session's length is its shortest layer's: layer 2 is empty.
  REQUIRE(ssa_session_length(f.s.get()) == 0);
  for (uint64_t n : {uint64_t{1}, kTokens, kTokens + 1, uint64_t{1} << 31, kLayerLimit, uint64_t{1} << 32,
                     uint64_t{1} << 63, UINT64_MAX}) {
    CAPTURE(n);
    CHECK(ssa_session_truncate(f.s.get(), n) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("cannot truncate"));
  }
  f.expect_unchanged(before0, before1);
  // With layer 2 filled, the length is kTokens: truncating to it changes nothing,
  // one token less shortens every layer.
  append_f32(f.s.get(), 2, f.K, f.V, kTokens, SSA_DTYPE_F32);
  CHECK(ssa_session_truncate(f.s.get(), kTokens + 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_truncate(f.s.get(), kTokens) == SSA_OK);
  CHECK(ssa_session_length(f.s.get()) == kTokens);
  CHECK(ssa_session_truncate(f.s.get(), kTokens - 1) == SSA_OK);
  for (uint32_t l = 0; l < kLayers; ++l) CHECK(ssa_session_layer_length(f.s.get(), l) == kTokens - 1);
}

TEST_CASE("decode: a layer index at or beyond n_layers is refused and writes nothing") {
  Fixture f;
  const std::vector<uint8_t> qb = encode(f.q, SSA_DTYPE_F32);
  ssa_decode_params p = params(SSA_METHOD_SSA);
  for (uint32_t layer : {kLayers, kLayers + 1, 1u << 31, 0xFFFFFFFFu}) {
    CAPTURE(layer);
    std::vector<uint8_t> out(qb.size(), 0x5A);
    CHECK(ssa_decode(f.s.get(), layer, qb.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("n_layers"));
    for (uint8_t b : out) REQUIRE(b == 0x5A);
    ssa_decode_item item{f.s.get(), qb.data(), out.data()};
    CHECK(ssa_decode_batch(&item, 1, layer, &p) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("item 0"));
    for (uint8_t b : out) REQUIRE(b == 0x5A);
  }
}

TEST_CASE("decode: budgets, sink and local sizes at their type's limits read the whole layer") {
  // Each of these covers every token: the output is exact dense attention.
  Fixture f;
  struct Case {
    const char* name;
    uint32_t budget, n_sink, n_local, max_budget;
    float target_error;
  };
  const Case cases[] = {
      {"budget 2^31", 1u << 31, 128, 128, 0, 0.0f},
      {"budget 2^32-1", 0xFFFFFFFFu, 128, 128, 0, 0.0f},
      {"n_sink 2^32-1", 8, 0xFFFFFFFFu, 0, 0, 0.0f},
      {"n_local 2^32-1", 8, 0, 0xFFFFFFFFu, 0, 0.0f},
      {"n_sink and n_local 2^32-1", 8, 0xFFFFFFFFu, 0xFFFFFFFFu, 0, 0.0f},
      {"error target, floor and cap 2^32-1", 0xFFFFFFFFu, 0, 0, 0xFFFFFFFFu, 0.05f},
      {"error target, floor 2^31, cap 2^32-1", 1u << 31, 0, 0, 0xFFFFFFFFu, 0.05f},
  };
  for (ssa_method m : kAllMethods) {
    for (const Case& c : cases) {
      if (c.target_error > 0.0f && m != SSA_METHOD_SSA && m != SSA_METHOD_SSA_ADAPTIVE) continue;
      CAPTURE(m);
      CAPTURE(c.name);
      ssa_decode_params p = params(m, c.budget);
      p.n_sink = c.n_sink;
      p.n_local = c.n_local;
      p.max_budget = c.max_budget;
      p.target_error = c.target_error;
      ssa_decode_stats st;
      ssa_decode_stats_init(&st);
      const std::vector<float> out = run_decode(f.s.get(), 0, f.q, SSA_DTYPE_F32, p, &st);
      CHECK(st.context_tokens == kTokens);
      CHECK(st.tokens_read == uint64_t{kQ} * kTokens);
      CHECK(st.draws == 0);
      for (uint32_t h = 0; h < kQ; ++h) {
        const std::vector<double> ref = f.reference(h);
        std::vector<double> got(out.begin() + size_t{h} * kD, out.begin() + size_t{h + 1} * kD);
        CHECK(rel_l2(got.data(), ref.data(), kD) < 1e-5);
      }
    }
  }
  // A floor above a nonzero cap is refused, whatever their size.
  ssa_decode_params p = params(SSA_METHOD_SSA, 0xFFFFFFFFu);
  p.target_error = 0.05f;
  p.max_budget = 1u << 31;
  const std::vector<uint8_t> qb = encode(f.q, SSA_DTYPE_F32);
  std::vector<uint8_t> out(qb.size(), 0x5A);
  CHECK(ssa_decode(f.s.get(), 0, qb.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(message_has("max_budget"));
  for (uint8_t b : out) REQUIRE(b == 0x5A);
}

TEST_CASE("decode_batch: an item count no array can hold is refused before items are read") {
  Fixture f;
  const std::vector<uint8_t> qb = encode(f.q, SSA_DTYPE_F32);
  std::vector<uint8_t> out(qb.size(), 0x5A);
  ssa_decode_item item{f.s.get(), qb.data(), out.data()};
  const ssa_decode_params p = params(SSA_METHOD_SSA);
  for (size_t n : {SIZE_MAX, size_t{1} << 63, SIZE_MAX / sizeof(ssa_decode_item) + 1,
                   static_cast<size_t>(PTRDIFF_MAX) / sizeof(ssa_decode_item) + 1}) {
    CAPTURE(n);
    CHECK(ssa_decode_batch(&item, n, 0, &p) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("n_items"));
  }
  for (uint8_t b : out) REQUIRE(b == 0x5A);
}

TEST_CASE("decode_batch: validation stops at the first bad item, whatever the item count claims") {
  // Two real items, the second without a session: counts of 2^31, 2^32 - 1 and
  // 2^32 items are refused naming item 1, having read only the first two.
  Fixture f;
  const std::vector<uint8_t> qb = encode(f.q, SSA_DTYPE_F32);
  std::vector<uint8_t> out0(qb.size(), 0x5A), out1(qb.size(), 0x5A);
  ssa_decode_item items[2] = {{f.s.get(), qb.data(), out0.data()}, {nullptr, qb.data(), out1.data()}};
  const ssa_decode_params p = params(SSA_METHOD_SSA);
  for (size_t n : {size_t{2}, size_t{1} << 31, size_t{0xFFFFFFFFu}, size_t{1} << 32}) {
    CAPTURE(n);
    CHECK(ssa_decode_batch(items, n, 0, &p) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("item 1"));
  }
  for (uint8_t b : out0) REQUIRE(b == 0x5A);
  for (uint8_t b : out1) REQUIRE(b == 0x5A);
}
