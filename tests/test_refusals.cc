// Refusals change nothing (ssa.h, Conventions: a failing call leaves every
// handle as it was), lazy work included. Every entry point that takes a session
// is called with each of its refusals on a session whose layer is below
// index_min_tokens, with parameters whose decode would train the layer's index
// on demand; after each refusal the session must equal an untouched twin fed
// the same tokens (every page, code, codebook, length and the metadata), and
// at the end both must decode the same after more tokens. Unsharded and
// sharded CPU runtimes.
#include <doctest/doctest.h>

#include <math.h>
#include <string.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "support/session_helpers.h"
#include "support/snapshot_helpers.h"

using namespace ssa_test;

namespace {

constexpr uint32_t kNq = 4, kNkv = 2, kD = 64;
constexpr uint64_t kTokens = 600;

ssa_session_config refusal_config() {
  ssa_session_config c = make_config(1, kNq, kNkv, kD, SSA_DTYPE_F32);
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  c.page_tokens = 64;
  c.index_min_tokens = 4096;  // the layer stays without an index
  c.index_train_sample = 512;
  c.index_iterations = 2;
  return c;
}

RuntimePtr runtime_of(uint32_t n_shards) {
  ssa_runtime_options o = runtime_options(SSA_BACKEND_CPU, 2);
  o.seed = 77;
  const int32_t devices[] = {0, 1, 2, 3};
  if (n_shards > 1) {
    o.devices = devices;
    o.n_devices = n_shards;
    o.shard_tokens = 8192;
  }
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  return RuntimePtr(rt);
}

// A decode that selects with the PQ proxy: it needs the index the layer lacks.
ssa_decode_params proxy_params() {
  ssa_decode_params p = params(SSA_METHOD_PQ_TOPK, 300);
  p.n_sink = 16;
  p.n_local = 16;
  return p;
}

struct Refusal {
  const char* what;
  ssa_status want;
  std::function<ssa_status()> call;
};

}  // namespace

TEST_CASE("refusals: every refused call leaves the session as its untouched twin, index training included") {
  for (uint32_t n_shards : {1u, 2u}) {
    CAPTURE(n_shards);
    const bool sharded = n_shards > 1;
    auto rt = runtime_of(n_shards);
    auto other_rt = runtime_of(1);
    auto s = make_session(rt.get(), refusal_config());
    auto twin = make_session(rt.get(), refusal_config());
    auto stranger = make_session(other_rt.get(), refusal_config());
    const std::vector<float> K = random_vec(kTokens * kNkv * kD, 11), V = random_vec(kTokens * kNkv * kD, 12);
    for (ssa_session* x : {s.get(), twin.get(), stranger.get()}) append_f32(x, 0, K, V, kTokens, SSA_DTYPE_F32);

    std::vector<float> q = random_vec(kNq * kD, 13), q_nan = q;
    q_nan[kNq * kD - 1] = NAN;
    std::vector<float> out(kNq * kD, 0.0f), out2(kNq * kD, 0.0f);
    // Room for any struct a caller could claim, so that a size believed is no overrun here.
    std::vector<uint64_t> big_stats(8192 / 8 + 1, 0);
    auto* stats_above = reinterpret_cast<ssa_decode_stats*>(big_stats.data());
    ssa_decode_stats_init(stats_above);
    stats_above->struct_size = 4097;
    ssa_decode_stats stats_small;
    ssa_decode_stats_init(&stats_small);
    stats_small.struct_size = 4;
    // Buffers of a trace: tokens, log_pi, offsets; capacity enough for any decode.
    const uint64_t cap = uint64_t{kNq} * kTokens;
    std::vector<uint32_t> tokens(cap);
    std::vector<float> log_pi(cap);
    std::vector<uint64_t> offsets(kNq + 1);

    const ssa_decode_params good = proxy_params();
    ssa_decode_params bad_sparsity = good;
    bad_sparsity.budget = 0;
    bad_sparsity.sparsity = 0.5f;
    ssa_decode_params bad_method = good;
    bad_method.method = static_cast<ssa_method>(99);
    ssa_decode_params bad_size = good;
    bad_size.struct_size = 3;
    ssa_decode_params target_pq = good;
    target_pq.target_error = 0.1f;
    ssa_decode_params target_group = good;
    target_group.method = SSA_METHOD_SSA;
    target_group.target_error = 0.1f;
    target_group.group_selection = SSA_GROUP_MIXTURE;
    ssa_decode_params target_ssa = good;
    target_ssa.method = SSA_METHOD_SSA;
    target_ssa.budget = 0;
    target_ssa.target_error = 0.1f;

    ssa_session* S = s.get();
    std::vector<Refusal> refusals = {
        {"decode: q NULL", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, nullptr, out.data(), &good, nullptr); }},
        {"decode: out NULL", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), nullptr, &good, nullptr); }},
        {"decode: layer out of range", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 1, q.data(), out.data(), &good, nullptr); }},
        {"decode: q and out overlap", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), q.data() + 1, &good, nullptr); }},
        {"decode: NaN in q", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q_nan.data(), out.data(), &good, nullptr); }},
        {"decode: sparsity below 1", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &bad_sparsity, nullptr); }},
        {"decode: unknown method", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &bad_method, nullptr); }},
        {"decode: params struct_size 3", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &bad_size, nullptr); }},
        {"decode: stats struct_size 4", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &good, &stats_small); }},
        {"decode: stats struct_size above the maximum", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &good, stats_above); }},
        {"decode: stats overlap out", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           auto* st = reinterpret_cast<ssa_decode_stats*>(out.data());
           ssa_decode_stats_init(st);
           return ssa_decode(S, 0, q.data(), out.data(), &good, st);
         }},
        {"decode: target_error with PQ_TOPK", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &target_pq, nullptr); }},
        {"decode: target_error with group selection", SSA_ERR_UNSUPPORTED,
         [&] { return ssa_decode(S, 0, q.data(), out.data(), &target_group, nullptr); }},
        {"traced: head_offsets NULL", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           return ssa_decode_traced(S, 0, q.data(), out.data(), &good, nullptr, tokens.data(), log_pi.data(), cap,
                                    nullptr);
         }},
        {"traced: tokens NULL with a capacity", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           return ssa_decode_traced(S, 0, q.data(), out.data(), &good, nullptr, nullptr, nullptr, 5,
                                    offsets.data());
         }},
        {"traced: capacity too small", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           return ssa_decode_traced(S, 0, q.data(), out.data(), &good, nullptr, tokens.data(), log_pi.data(), 1,
                                    offsets.data());
         }},
        {"traced: head_offsets overlap q", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           auto* at = reinterpret_cast<uint64_t*>(q.data() + kNq * kD - 2 * (kNq + 1));
           std::vector<float> keep = q;
           const ssa_status st = ssa_decode_traced(S, 0, q.data(), out.data(), &good, nullptr, tokens.data(),
                                                   log_pi.data(), cap, at);
           q = keep;
           return st;
         }},
        {"traced: stats struct_size above the maximum", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           return ssa_decode_traced(S, 0, q.data(), out.data(), &good, stats_above, tokens.data(), log_pi.data(),
                                    cap, offsets.data());
         }},
        {"traced: sparsity below 1", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           return ssa_decode_traced(S, 0, q.data(), out.data(), &bad_sparsity, nullptr, tokens.data(),
                                    log_pi.data(), cap, offsets.data());
         }},
        {"batch: items NULL", SSA_ERR_INVALID_ARGUMENT, [&] { return ssa_decode_batch(nullptr, 1, 0, &good); }},
        {"batch: q NULL in the second item", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           const ssa_decode_item items[] = {{S, q.data(), out.data()}, {S, nullptr, out2.data()}};
           return ssa_decode_batch(items, 2, 0, &good);
         }},
        {"batch: an out overlaps another item's q", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           const ssa_decode_item items[] = {{S, q.data(), out.data()}, {S, out.data(), out2.data()}};
           return ssa_decode_batch(items, 2, 0, &good);
         }},
        {"batch: sessions of two runtimes", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           const ssa_decode_item items[] = {{S, q.data(), out.data()}, {stranger.get(), q.data(), out2.data()}};
           return ssa_decode_batch(items, 2, 0, &good);
         }},
        {"batch: sparsity below 1", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           const ssa_decode_item items[] = {{S, q.data(), out.data()}};
           return ssa_decode_batch(items, 1, 0, &bad_sparsity);
         }},
        {"batch: target_error with group selection", SSA_ERR_UNSUPPORTED,
         [&] {
           const ssa_decode_item items[] = {{S, q.data(), out.data()}};
           return ssa_decode_batch(items, 1, 0, &target_group);
         }},
        {"append: k NULL", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_session_append(S, 0, nullptr, V.data(), 1); }},
        {"append: layer out of range", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_session_append(S, 1, K.data(), V.data(), 1); }},
        {"append: NaN in the last row of an append that reaches index_min_tokens", SSA_ERR_INVALID_ARGUMENT,
         [&] {
           const uint64_t n = 4096;
           std::vector<float> k = random_vec(n * kNkv * kD, 21), v = random_vec(n * kNkv * kD, 22);
           v.back() = INFINITY;
           return ssa_session_append(S, 0, k.data(), v.data(), n);
         }},
        {"truncate: beyond the length", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_session_truncate(S, kTokens + 1); }},
        {"set_metadata: bytes NULL", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_session_set_metadata(S, nullptr, 5); }},
        {"set_metadata: more than 64 MiB", SSA_ERR_INVALID_ARGUMENT,
         [&] { return ssa_session_set_metadata(S, q.data(), (size_t{64} << 20) + 1); }},
        {"fork: out NULL", SSA_ERR_INVALID_ARGUMENT, [&] { return ssa_session_fork(S, nullptr); }},
    };
    if (sharded) {
      refusals.push_back({"decode: target_error on a sharded session", SSA_ERR_UNSUPPORTED,
                          [&] { return ssa_decode(S, 0, q.data(), out.data(), &target_ssa, nullptr); }});
      refusals.push_back({"traced: target_error on a sharded session", SSA_ERR_UNSUPPORTED, [&] {
                            return ssa_decode_traced(S, 0, q.data(), out.data(), &target_ssa, nullptr,
                                                     tokens.data(), log_pi.data(), cap, offsets.data());
                          }});
      refusals.push_back({"batch: target_error on a sharded session", SSA_ERR_UNSUPPORTED, [&] {
                            const ssa_decode_item items[] = {{S, q.data(), out.data()}};
                            return ssa_decode_batch(items, 1, 0, &target_ssa);
                          }});
    }

    // Each refusal on a session of its own (the first that changes one is named),
    // then all of them on `s`.
    for (const Refusal& r : refusals) {
      const std::string what = r.what;
      CAPTURE(what);
      auto fresh = make_session(rt.get(), refusal_config());
      append_f32(fresh.get(), 0, K, V, kTokens, SSA_DTYPE_F32);
      S = fresh.get();
      const ssa_status st = r.call();
      CAPTURE(ssa_last_error_message());
      CHECK(st == r.want);
      CHECK(std::string(ssa_last_error_message()).size() > 0);
      CHECK(ssa::test::store_diff(*S, *twin) == "");
    }
    S = s.get();
    for (const Refusal& r : refusals) {
      const std::string what = r.what;
      CAPTURE(what);
      CHECK(r.call() == r.want);
    }
    CHECK(ssa::test::store_diff(*S, *twin) == "");

    // And the two stay the same session: after more tokens (the index trained
    // on the layer as it is then), every decode agrees bitwise.
    const std::vector<float> K2 = random_vec(6 * kNkv * kD, 31), V2 = random_vec(6 * kNkv * kD, 32);
    for (ssa_session* x : {s.get(), twin.get()}) append_f32(x, 0, K2, V2, 6, SSA_DTYPE_F32);
    for (ssa_method m : kAllMethods) {
      CAPTURE(m);
      ssa_decode_params p = proxy_params();
      p.method = m;
      const std::vector<float> a = run_decode(s.get(), 0, q, SSA_DTYPE_F32, p);
      const std::vector<float> b = run_decode(twin.get(), 0, q, SSA_DTYPE_F32, p);
      CHECK(memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    CHECK(ssa::test::store_diff(*S, *twin) == "");
  }
}

TEST_CASE("aliasing: caller buffers of one call that overlap are refused, with nothing written") {
  auto rt = runtime_of(1);
  auto s = make_session(rt.get(), refusal_config());
  append_f32(s.get(), 0, random_vec(kTokens * kNkv * kD, 41), random_vec(kTokens * kNkv * kD, 42), kTokens,
             SSA_DTYPE_F32);
  SSA_CHECK_OK(ssa_session_update_index(s.get()));
  const ssa_decode_params p = proxy_params();
  const uint64_t cap = uint64_t{kNq} * kTokens;
  const size_t q_bytes = size_t{kNq} * kD * sizeof(float);
  // One arena: every buffer of a call is carved out of it, here apart, there overlapping.
  std::vector<uint64_t> arena_words((2 * q_bytes + cap * 8 + (kNq + 1) * 8 + 4096) / 8 + 64);
  uint8_t* arena = reinterpret_cast<uint8_t*>(arena_words.data());
  const std::vector<float> qv = random_vec(kNq * kD, 43);
  struct Layout {
    size_t q, out, stats, tokens, log_pi, offsets;  // byte offsets into the arena
  };
  // Apart: q, out, stats, tokens, log_pi, offsets one after the other.
  const Layout apart{0, q_bytes, 2 * q_bytes, 2 * q_bytes + 256, 2 * q_bytes + 256 + cap * 4,
                     2 * q_bytes + 256 + cap * 8};
  auto run = [&](const Layout& L, bool with_stats, bool with_log_pi) {
    memset(arena, 0xEE, arena_words.size() * 8);
    memcpy(arena + L.q, qv.data(), q_bytes);
    auto* st = reinterpret_cast<ssa_decode_stats*>(arena + L.stats);
    if (with_stats) ssa_decode_stats_init(st);
    return ssa_decode_traced(s.get(), 0, arena + L.q, arena + L.out, &p, with_stats ? st : nullptr,
                             reinterpret_cast<uint32_t*>(arena + L.tokens),
                             with_log_pi ? reinterpret_cast<float*>(arena + L.log_pi) : nullptr, cap,
                             reinterpret_cast<uint64_t*>(arena + L.offsets));
  };
  SSA_CHECK_OK(run(apart, true, true));
  const std::vector<uint64_t> good = arena_words;

  struct Case {
    const char* what;
    Layout L;
    bool with_stats, with_log_pi;
  };
  Layout offsets_in_log_pi = apart;
  offsets_in_log_pi.offsets = apart.log_pi + 64;
  Layout offsets_in_tokens = apart;
  offsets_in_tokens.offsets = apart.tokens + 8;
  Layout tokens_over_log_pi = apart;
  tokens_over_log_pi.log_pi = apart.tokens + 4 * (cap - 1);  // the last token and the first log_pi
  Layout log_pi_over_out = apart;
  log_pi_over_out.log_pi = apart.out + q_bytes - 4;
  Layout tokens_over_q = apart;
  tokens_over_q.tokens = apart.q + q_bytes / 2;
  Layout stats_over_tokens = apart;
  stats_over_tokens.stats = apart.tokens + 16;
  Layout stats_over_q = apart;
  stats_over_q.stats = apart.q + 8;
  Layout offsets_over_out = apart;
  offsets_over_out.offsets = apart.out + 8;
  const Case cases[] = {
      {"head_offsets inside log_pi", offsets_in_log_pi, false, true},
      {"head_offsets inside tokens", offsets_in_tokens, false, false},
      {"tokens overlap log_pi", tokens_over_log_pi, false, true},
      {"log_pi overlaps out", log_pi_over_out, false, true},
      {"tokens overlap q", tokens_over_q, false, false},
      {"stats overlap tokens", stats_over_tokens, true, false},
      {"stats overlap q", stats_over_q, true, false},
      {"head_offsets overlap out", offsets_over_out, false, false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    CHECK(run(c.L, c.with_stats, c.with_log_pi) == SSA_ERR_INVALID_ARGUMENT);
    CAPTURE(ssa_last_error_message());
    CHECK(std::string(ssa_last_error_message()).find("overlap") != std::string::npos);
    // Nothing written: the arena holds q and the fill (and the stats' init) only.
    std::vector<uint64_t> want(arena_words.size());
    uint8_t* w = reinterpret_cast<uint8_t*>(want.data());
    memset(w, 0xEE, want.size() * 8);
    memcpy(w + c.L.q, qv.data(), q_bytes);
    if (c.with_stats) ssa_decode_stats_init(reinterpret_cast<ssa_decode_stats*>(w + c.L.stats));
    CHECK(arena_words == want);
  }
  // Buffers that touch without overlapping are fine (tokens then log_pi, end to end).
  Layout touching = apart;
  touching.log_pi = apart.tokens + 4 * cap;
  SSA_CHECK_OK(run(touching, true, true));
  CHECK(arena_words == good);

  // ssa_decode: stats against q and out.
  std::vector<float> q = qv, out(kNq * kD);
  auto* st_q = reinterpret_cast<ssa_decode_stats*>(q.data() + 4);
  ssa_decode_stats_init(st_q);
  CHECK(ssa_decode(s.get(), 0, q.data(), out.data(), &p, st_q) == SSA_ERR_INVALID_ARGUMENT);
  auto* st_out = reinterpret_cast<ssa_decode_stats*>(out.data() + 8);
  ssa_decode_stats_init(st_out);
  CHECK(ssa_decode(s.get(), 0, qv.data(), out.data(), &p, st_out) == SSA_ERR_INVALID_ARGUMENT);
  // ssa_session_get_metadata: n_out inside buf.
  SSA_CHECK_OK(ssa_session_set_metadata(s.get(), "metadata!", 9));
  std::vector<uint64_t> buf(4, 0);
  CHECK(ssa_session_get_metadata(s.get(), buf.data(), 32, reinterpret_cast<size_t*>(buf.data() + 1)) ==
        SSA_ERR_INVALID_ARGUMENT);
  CHECK(buf == std::vector<uint64_t>(4, 0));
  size_t n = 0;
  SSA_CHECK_OK(ssa_session_get_metadata(s.get(), buf.data(), 32, &n));
  CHECK(n == 9);
}
