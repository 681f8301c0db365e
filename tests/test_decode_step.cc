// ssa_decode_step on CPU sessions: one call per layer and token that is exactly
// an append of the token followed by a decode with the RNG step p.step + the
// token's position (the contract CUDA reservations keep on the device, so one
// loop runs on either backend). Checked bitwise against the two calls made
// separately on a twin session, for every method, over random data; the batch
// form against the single form; reserve and sync on CPU sessions; and every
// refused argument changes nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ssa.h"
#include "support/config.h"
#include "support/handles.h"

namespace {

using ssa_test::make_config;
using ssa_test::make_runtime;
using ssa_test::make_session;

constexpr uint32_t kLayers = 2, kNq = 4, kNkv = 2, kD = 32;
constexpr size_t kRow = size_t{kNkv} * kD, kQ = size_t{kNq} * kD;

std::vector<uint16_t> random_f16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    // f16 bits of a normal value (exponent range kept small: always finite).
    const float f = nd(rng);
    const uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = std::min(std::fabs(f), 7.99f);
    if (a < 1.0f / 16384) a = 0.f;  // below the normal range: zero
    int e = 0;
    const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    const uint16_t exp = a == 0.f ? 0 : static_cast<uint16_t>(e - 1 + 15);
    const uint16_t man = a == 0.f ? 0 : static_cast<uint16_t>((m * 2.f - 1.f) * 1024.f);
    x = sign | static_cast<uint16_t>(exp << 10) | man;
  }
  return v;
}

ssa_session_config step_config() {
  ssa_session_config c = make_config(kLayers, kNq, kNkv, kD);
  c.page_tokens = 16;
  c.pq_subspaces = 4;
  c.pq_centroids = 16;
  c.index_min_tokens = 64;
  return c;
}

void prefill(ssa_session* s, uint32_t n, std::mt19937_64& rng) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    const auto k = random_f16(n * kRow, rng), v = random_f16(n * kRow, rng);
    SSA_CHECK_OK(ssa_session_append(s, l, k.data(), v.data(), n));
  }
}

}  // namespace

TEST_CASE("decode step on the CPU: an append then a decode at step p.step + position, bitwise") {
  auto rt = make_runtime(2);
  const ssa_session_config c = step_config();
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA_ADAPTIVE,
                       SSA_METHOD_HYBRID_UNIFORM}) {
    INFO("method ", m);
    auto a = make_session(rt.get(), c), b = make_session(rt.get(), c);
    std::mt19937_64 rng(m + 1), rng_b(m + 1);
    prefill(a.get(), 300, rng);
    prefill(b.get(), 300, rng_b);
    REQUIRE(ssa_session_reserve(a.get(), 64) == SSA_OK);  // CPU: nothing to reserve
    ssa_decode_params p = ssa_test::params(m, 0, 8.0f);
    p.n_sink = 8;
    p.n_local = 8;
    p.step = 1000;
    for (uint32_t t = 0; t < 40; ++t) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        const auto k = random_f16(kRow, rng), v = random_f16(kRow, rng), q = random_f16(kQ, rng);
        std::vector<uint16_t> out_a(kQ, 1), out_b(kQ, 2);
        ssa_decode_stats st_a, st_b;
        ssa_decode_stats_init(&st_a);
        ssa_decode_stats_init(&st_b);
        const uint64_t position = ssa_session_layer_length(b.get(), l);
        SSA_CHECK_OK(ssa_decode_step(a.get(), l, k.data(), v.data(), q.data(), out_a.data(), &p, &st_a));
        SSA_CHECK_OK(ssa_session_append(b.get(), l, k.data(), v.data(), 1));
        ssa_decode_params pb = p;
        pb.step = p.step + position;
        SSA_CHECK_OK(ssa_decode(b.get(), l, q.data(), out_b.data(), &pb, &st_b));
        REQUIRE(out_a == out_b);
        CHECK(st_a.tokens_read == st_b.tokens_read);
        CHECK(st_a.draws == st_b.draws);
        CHECK(st_a.context_tokens == position + 1);
        CHECK(ssa_session_layer_length(a.get(), l) == position + 1);
      }
    }
    uint64_t dropped = 7;
    SSA_CHECK_OK(ssa_session_sync(a.get(), &dropped));
    CHECK(dropped == 0);
    CHECK(ssa_session_length(a.get()) == 340);
  }
}

TEST_CASE("decode step on the CPU: the batch form equals single steps, stats summed") {
  auto rt = make_runtime(2);
  const ssa_session_config c = step_config();
  std::mt19937_64 rng(5), rng2(5);
  std::vector<ssa_test::SessionPtr> batch, single;
  const uint32_t lengths[] = {100, 257, 64};
  for (uint32_t n : lengths) {
    batch.push_back(make_session(rt.get(), c));
    single.push_back(make_session(rt.get(), c));
    prefill(batch.back().get(), n, rng);
    prefill(single.back().get(), n, rng2);
  }
  ssa_decode_params p = ssa_test::params(SSA_METHOD_SSA, 24);
  p.n_sink = 4;
  p.n_local = 4;
  for (uint32_t t = 0; t < 10; ++t) {
    std::vector<std::vector<uint16_t>> k, v, q, out(3, std::vector<uint16_t>(kQ)), want(3, std::vector<uint16_t>(kQ));
    std::vector<ssa_decode_step_item> items;
    for (int i = 0; i < 3; ++i) {
      k.push_back(random_f16(kRow, rng));
      v.push_back(random_f16(kRow, rng));
      q.push_back(random_f16(kQ, rng));
    }
    for (int i = 0; i < 3; ++i) items.push_back({batch[i].get(), k[i].data(), v[i].data(), q[i].data(), out[i].data()});
    ssa_decode_stats sum, one;
    ssa_decode_stats_init(&sum);
    SSA_CHECK_OK(ssa_decode_step_batch(items.data(), items.size(), 1, &p, &sum));
    uint64_t reads = 0;
    for (int i = 0; i < 3; ++i) {
      ssa_decode_stats_init(&one);
      SSA_CHECK_OK(ssa_decode_step(single[i].get(), 1, k[i].data(), v[i].data(), q[i].data(), want[i].data(), &p, &one));
      reads += one.tokens_read;
      CHECK(out[i] == want[i]);
    }
    CHECK(sum.tokens_read == reads);
  }
}

TEST_CASE("decode step on the CPU: refused arguments change nothing") {
  auto rt = make_runtime(2);
  const ssa_session_config c = step_config();
  auto s = make_session(rt.get(), c);
  std::mt19937_64 rng(9);
  const auto k = random_f16(kRow, rng), v = random_f16(kRow, rng), q = random_f16(kQ, rng);
  std::vector<uint16_t> out(kQ, 0x1234);
  ssa_decode_params p = ssa_test::params(SSA_METHOD_SSA, 16);
  // An empty layer cannot be reserved (nothing to index), nor decoded.
  CHECK(ssa_session_reserve(s.get(), 10) == SSA_ERR_INVALID_ARGUMENT);
  prefill(s.get(), 50, rng);
  CHECK(ssa_session_reserve(s.get(), 0) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_reserve(nullptr, 10) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_sync(nullptr, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  // A turn started ahead: nothing to move on the CPU; refused arguments named.
  CHECK(ssa_session_prefetch(nullptr, 10) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_prefetch(s.get(), uint64_t{1} << 40) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ssa_last_error_message()).find("n_tokens") != std::string::npos);
  CHECK(ssa_session_prefetch(s.get(), 0) == SSA_OK);
  CHECK(ssa_session_prefetch(s.get(), 64) == SSA_OK);
  CHECK(ssa_decode_step(nullptr, 0, k.data(), v.data(), q.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_step(s.get(), kLayers, k.data(), v.data(), q.data(), out.data(), &p, nullptr) ==
        SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_step(s.get(), 0, nullptr, v.data(), q.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_step(s.get(), 0, k.data(), v.data(), q.data(), nullptr, &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  // q and out overlapping.
  std::vector<uint16_t> qo(2 * kQ);
  CHECK(ssa_decode_step(s.get(), 0, k.data(), v.data(), qo.data(), qo.data() + kQ / 2, &p, nullptr) ==
        SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params bad = p;
  bad.sparsity = 0.5f;
  bad.budget = 0;
  CHECK(ssa_decode_step(s.get(), 0, k.data(), v.data(), q.data(), out.data(), &bad, nullptr) ==
        SSA_ERR_INVALID_ARGUMENT);
  // A NaN in k: scanned as any CPU append is.
  auto nan_k = k;
  nan_k[3] = 0x7E00;
  CHECK(ssa_decode_step(s.get(), 0, nan_k.data(), v.data(), q.data(), out.data(), &p, nullptr) ==
        SSA_ERR_INVALID_ARGUMENT);
  // One session twice in a batch would append twice.
  std::vector<uint16_t> out2(kQ);
  const ssa_decode_step_item twice[] = {{s.get(), k.data(), v.data(), q.data(), out.data()},
                                        {s.get(), k.data(), v.data(), q.data(), out2.data()}};
  CHECK(ssa_decode_step_batch(twice, 2, 0, &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_step_batch(nullptr, 1, 0, &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_decode_step_batch(nullptr, 0, 0, &p, nullptr) == SSA_OK);
  for (uint32_t l = 0; l < kLayers; ++l) CHECK(ssa_session_layer_length(s.get(), l) == 50);
  CHECK(out == std::vector<uint16_t>(kQ, 0x1234));
}
