// The proxies beyond PQ on CUDA sessions (OPQ, QPQ: a learned transform; PQ4,
// OPQ4, QPQ4: 4-bit codes) against the CPU backend on the same keys and queries:
// the same observed query moments and trained index (codebooks, transforms),
// codes equal up to near-ties (counted, each checked against a float64
// nearest-centroid reference), decodes that agree with the CPU's (bitwise the
// same tables, so the same PQ top-k; the stochastic methods as close to dense),
// snapshots in both directions, decode steps through a reservation, and refused
// inputs that change nothing.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_alloc.h"
#include "index/proxy_kind.h"
#include "session.h"
#include "shard/shard_options.h"
#include "ssa.h"
#include "support/gpu_sessions.h"
#include "support/pq_reference.h"

namespace ssa::gputest {
namespace {

struct ProxyCase {
  ssa_proxy proxy;
  uint32_t subspaces, centroids;
  const char* name;
};
const ProxyCase kCases[] = {{SSA_PROXY_OPQ, 16, 256, "OPQ"},
                            {SSA_PROXY_QPQ, 16, 256, "QPQ"},
                            {SSA_PROXY_PQ4, 32, 16, "PQ4"},
                            {SSA_PROXY_OPQ4, 32, 16, "OPQ4"},
                            {SSA_PROXY_QPQ4, 32, 16, "QPQ4"}};

bool query_aware(ssa_proxy p) { return p == SSA_PROXY_QPQ || p == SSA_PROXY_QPQ4; }

std::string temp_path(const char* name) {
  return std::string(P_tmpdir) + "/ssa_gpu_proxy_" + std::to_string(getpid()) + "_" + name;
}

ssa_session* proxy_session(ssa_runtime* rt, const ProxyCase& pc, uint32_t flags = 0) {
  ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  c.page_tokens = 128;
  c.flags = flags;
  c.index_min_tokens = 1024;
  c.proxy = pc.proxy;
  c.pq_subspaces = pc.subspaces;
  c.pq_centroids = pc.centroids;
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_create(rt, &c, &s);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return s;
}

ssa_session* load(ssa_runtime* rt, const std::string& path) {
  ssa_session* s = nullptr;
  const ssa_status st = ssa_session_load(rt, path.c_str(), 0, &s);
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
  return s;
}

// Queries of an anisotropic second moment (a scale per dimension, and a shared
// direction), so that the learned whitening is far from the identity. f16 bits,
// [n][kNq][kD].
std::vector<uint16_t> observed_queries(uint32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> dir(kD);
  for (float& x : dir) x = nd(rng);
  std::vector<uint16_t> q(size_t{n} * kNq * kD);
  for (size_t i = 0; i < size_t{n} * kNq; ++i) {
    const float a = nd(rng);
    for (uint32_t j = 0; j < kD; ++j) {
      const float scale = 0.1f + 2.0f * static_cast<float>(j % 9) / 9.0f;
      q[i * kD + j] = f32_to_f16(scale * nd(rng) + a * dir[j]);
    }
  }
  return q;
}

void observe(ssa_session* s, const std::vector<uint16_t>& q, uint32_t n, bool device) {
  ssa_status st;
  if (!device) {
    st = ssa_session_observe_queries(s, 0, q.data(), n);
  } else {
    DevBuf<uint16_t> dq(q.size());
    dq.upload(q);
    st = ssa_session_observe_queries(s, 0, dq.p, n);
  }
  INFO(ssa_last_error_message());
  REQUIRE(st == SSA_OK);
}

// Largest |a - b| over the largest |b| (0 for two empty vectors).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  return mag > 0.0 ? diff / mag : diff;
}

// The code bytes of layer 0, page after page (device or host pages).
std::vector<uint8_t> layer_codes(const ssa_session* s) {
  const LayerStore& layer = s->layers[0];
  const size_t bytes = s->layout.code_page_bytes();
  std::vector<uint8_t> out(layer.code_pages.size() * bytes);
  for (size_t p = 0; p < layer.code_pages.size(); ++p)
    CUDA_OK(cudaMemcpy(out.data() + p * bytes, layer.code_pages[p]->data(), bytes, cudaMemcpyDefault));
  return out;
}

// Key (token t, KV head h) as the index sees it: T k in float64 for a
// transformed proxy, k otherwise.
std::vector<double> indexed_key(const Data& d, const PqCodebooks& cb, uint32_t t, uint32_t h) {
  std::vector<double> k(kD), z(kD);
  for (uint32_t j = 0; j < kD; ++j) k[j] = f16_to_f32(d.k[(size_t{t} * kNkv + h) * kD + j]);
  if (!cb.rotated()) return k;
  const float* r = cb.rotation_of(h);
  for (uint32_t i = 0; i < kD; ++i) {
    double s = 0.0;
    for (uint32_t j = 0; j < kD; ++j) s += static_cast<double>(r[size_t{i} * kD + j]) * k[j];
    z[i] = s;
  }
  return z;
}

struct CodeComparison {
  uint64_t codes = 0, differ = 0, not_nearest = 0;
};

// Every code of the two sessions' layer 0 (the same codebooks): where they
// differ, both must be nearest centroids of the float64 key within rounding.
CodeComparison compare_codes(const ssa_session* a, const ssa_session* b, const Data& d) {
  const KvLayout& L = a->layout;
  const PqCodebooks& cb = *a->layers[0].codebooks;
  const std::vector<uint8_t> ca = layer_codes(a), cbytes = layer_codes(b);
  const size_t page_bytes = L.code_page_bytes();
  REQUIRE(ca.size() >= L.pages_for(d.n) * page_bytes);
  REQUIRE(cbytes.size() >= L.pages_for(d.n) * page_bytes);
  CodeComparison r;
  for (uint32_t t = 0; t < d.n; ++t) {
    const uint8_t* pa = ca.data() + (t / L.page_tokens) * page_bytes;
    const uint8_t* pb = cbytes.data() + (t / L.page_tokens) * page_bytes;
    for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
      std::vector<double> z;
      for (uint32_t m = 0; m < L.pq_subspaces; ++m) {
        const uint32_t x = L.code_at(pa, h, m, t % L.page_tokens), y = L.code_at(pb, h, m, t % L.page_tokens);
        ++r.codes;
        if (x == y) continue;
        ++r.differ;
        if (z.empty()) z = indexed_key(d, cb, t, h);
        if (!ssa_test::is_nearest_centroid(cb, h, m, z.data(), x) || !ssa_test::is_nearest_centroid(cb, h, m, z.data(), y))
          ++r.not_nearest;
      }
    }
  }
  return r;
}

const ssa_method kDeterministic[] = {SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK};
const ssa_method kStochastic[] = {SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                                  SSA_METHOD_SSA_ADAPTIVE};

TEST_CASE("gpu proxies: CUDA sessions learn the CPU's index, encode its codes and decode as it does") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(9000, 61);
  const std::vector<uint16_t> obs = observed_queries(96, 62);
  for (const ProxyCase& pc : kCases) {
    const std::string name = pc.name;
    CAPTURE(name);
    ssa_session* sc = proxy_session(cpu, pc);
    ssa_session* sg = proxy_session(gpu, pc);  // device pointers
    if (query_aware(pc.proxy)) {
      // In two calls, the second after the first has been accumulated.
      observe(sc, obs, 40, false);
      observe(sg, obs, 40, true);
      const std::vector<uint16_t> rest(obs.begin() + size_t{40} * kNq * kD, obs.end());
      observe(sc, rest, 56, false);
      observe(sg, rest, 56, true);
      const QueryMoments& mc = *sc->layers[0].query_moments;
      const QueryMoments& mg = *sg->layers[0].query_moments;
      CHECK(mc.count == mg.count);
      CHECK(mc.sum == mg.sum);  // the same float64 accumulation of the same values
    }
    fill(sc, d, false);
    fill(sg, d, true);  // trains at the first part's length, encodes both parts
    const PqCodebooks& bc = *sc->layers[0].codebooks;
    const PqCodebooks& bg = *sg->layers[0].codebooks;
    REQUIRE(sc->layers[0].trained_at_tokens == sg->layers[0].trained_at_tokens);
    // Trained from the same sample by the same code: the same index.
    CHECK(max_rel_diff(bg.data, bc.data) <= 1e-6);
    CHECK(max_rel_diff(bg.rotation, bc.rotation) <= 1e-6);
    CHECK(max_rel_diff(bg.query_transform, bc.query_transform) <= 1e-6);
    CHECK(bg.rotated() == (pc.proxy != SSA_PROXY_PQ4));
    CHECK(bg.query_transform.empty() == !query_aware(pc.proxy));
    if (query_aware(pc.proxy)) {
      // The transform was learned from the queries: not OPQ's starting rotation
      // (an orthogonal matrix), T^T Q = I as loaded files are checked.
      CHECK(bg.trained_moments != nullptr);
    }

    // Codes: equal but for near-ties of two centroids, each checked in float64.
    const CodeComparison cmp = compare_codes(sg, sc, d);
    MESSAGE(name, ": ", cmp.differ, " of ", cmp.codes, " codes differ from the CPU's");
    CHECK(cmp.not_nearest == 0);
    CHECK(cmp.differ * 1000 <= cmp.codes);  // at most 0.1%

    // A CPU session with the GPU's codes (its snapshot): PQ top-k ranks by the
    // same tables (bit for bit, 4-bit tables too), so it reads the same tokens.
    const std::string a = temp_path("a.ssa"), b = temp_path("b.ssa"), c = temp_path("c.ssa");
    REQUIRE(ssa_session_save(sg, a.c_str()) == SSA_OK);
    ssa_session* lc = load(cpu, a);
    CHECK(compare_codes(lc, sg, d).differ == 0);
    const auto dense_cpu = decode(sc, d, params(SSA_METHOD_DENSE, 0), false);
    const auto dense_gpu = decode(sg, d, params(SSA_METHOD_DENSE, 0), true);
    CHECK(rel(dense_gpu, dense_cpu) < 2e-3);
    for (ssa_method m : kDeterministic) {
      INFO("method ", m);
      const auto out = decode(sg, d, params(m, 900, 3), true);
      CHECK(rel(out, decode(lc, d, params(m, 900, 3), false)) < 2e-3);
      if (m != SSA_METHOD_DENSE) CHECK(rel(out, dense_gpu) > 1e-4);  // sparse, not dense
    }
    // Samples come from each backend's own generator: over 8 steps the GPU's
    // mean error against dense is within 1.5x of the CPU's on the same codes.
    for (ssa_method m : kStochastic) {
      double eg = 0, ec = 0;
      for (uint64_t step = 0; step < 8; ++step) {
        eg += rel(decode(sg, d, params(m, 900, step), true), dense_gpu) / 8;
        ec += rel(decode(lc, d, params(m, 900, step), false), dense_cpu) / 8;
      }
      INFO("method ", m, ": mean error GPU ", eg, ", CPU ", ec);
      CHECK(eg < 1.5 * ec + 0.01);
    }
    // And back: the CPU's save of what it loaded holds the same bytes, every
    // method decodes bitwise as the original CUDA session.
    REQUIRE(ssa_session_save(lc, b.c_str()) == SSA_OK);
    ssa_session* lg = load(gpu, b);
    for (ssa_method m : kDeterministic) CHECK(decode(lg, d, params(m, 900, 3), true) == decode(sg, d, params(m, 900, 3), true));
    for (ssa_method m : kStochastic) CHECK(decode(lg, d, params(m, 900, 3), true) == decode(sg, d, params(m, 900, 3), true));
    // CPU -> CUDA: the CPU's own index decodes on the GPU as on the CPU, and
    // appends to the loaded session encode with its codebooks and transforms.
    REQUIRE(ssa_session_save(sc, c.c_str()) == SSA_OK);
    ssa_session* lcg = load(gpu, c);
    CHECK(compare_codes(lcg, sc, d).differ == 0);
    CHECK(rel(decode(lcg, d, params(SSA_METHOD_PQ_TOPK, 900, 3), true),
              decode(sc, d, params(SSA_METHOD_PQ_TOPK, 900, 3), false)) < 2e-3);
    const Data more = make_data(700, 63);
    fill(lcg, more, true);
    fill(sc, more, false);
    CHECK(sc->layers[0].codebooks.get() != nullptr);
    if (sc->layers[0].trained_at_tokens == lcg->layers[0].trained_at_tokens) {
      Data both = d;  // the keys of both appends, for the float64 reference
      both.n = d.n + more.n;
      both.k.insert(both.k.end(), more.k.begin(), more.k.end());
      const CodeComparison app = compare_codes(lcg, sc, both);
      CHECK(app.not_nearest == 0);
      CHECK(app.differ * 1000 <= app.codes);
    }
    ssa_session_destroy(lcg);
    ssa_session_destroy(lg);
    ssa_session_destroy(lc);
    ssa_session_destroy(sg);
    ssa_session_destroy(sc);
    for (const std::string& p : {a, b, c}) unlink(p.c_str());
  }
  ssa_runtime_destroy(gpu);
  ssa_runtime_destroy(cpu);
}

TEST_CASE("gpu proxies: a retrain after more queries re-encodes on the device as the CPU does") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(5000, 71);
  const std::vector<uint16_t> obs = observed_queries(64, 72);
  for (const ProxyCase& pc : kCases) {
    if (!query_aware(pc.proxy)) continue;
    CAPTURE(pc.name);
    ssa_session* sc = proxy_session(cpu, pc);
    ssa_session* sg = proxy_session(gpu, pc, SSA_SESSION_HOST_POINTERS);  // host queries on a CUDA session
    fill(sc, d, false);
    fill(sg, d, false);  // trained before any query: the identity in place of the whitening
    observe(sc, obs, 64, false);
    observe(sg, obs, 64, false);
    REQUIRE(ssa_session_update_index(sc) == SSA_OK);
    REQUIRE(ssa_session_update_index(sg) == SSA_OK);
    const PqCodebooks& bc = *sc->layers[0].codebooks;
    const PqCodebooks& bg = *sg->layers[0].codebooks;
    CHECK(max_rel_diff(bg.rotation, bc.rotation) <= 1e-6);
    CHECK(max_rel_diff(bg.query_transform, bc.query_transform) <= 1e-6);
    CHECK(max_rel_diff(bg.data, bc.data) <= 1e-6);
    const CodeComparison cmp = compare_codes(sg, sc, d);
    CHECK(cmp.not_nearest == 0);
    CHECK(cmp.differ * 1000 <= cmp.codes);
    CHECK(rel(decode(sg, d, params(SSA_METHOD_PQ_TOPK, 700, 1), false),
              decode(sc, d, params(SSA_METHOD_PQ_TOPK, 700, 1), false)) < 2e-3);
    ssa_session_destroy(sg);
    ssa_session_destroy(sc);
  }
  ssa_runtime_destroy(gpu);
  ssa_runtime_destroy(cpu);
}

TEST_CASE("gpu proxies: decode steps through a reservation encode and score as eager decodes") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(4000, 81);
  const Data steps = make_data(6, 82);
  const std::vector<uint16_t> obs = observed_queries(32, 83);
  const size_t row = size_t{kNkv} * kD;
  for (const ProxyCase& pc : kCases) {
    CAPTURE(pc.name);
    ssa_session* eager = proxy_session(gpu, pc);
    if (query_aware(pc.proxy)) observe(eager, obs, 32, true);
    fill(eager, d, true);
    ssa_session* stepped = nullptr;
    REQUIRE(ssa_session_fork(eager, &stepped) == SSA_OK);
    REQUIRE(ssa_session_reserve(stepped, steps.n) == SSA_OK);
    DevBuf<uint16_t> k(steps.k.size()), v(steps.v.size()), q(d.q.size()), o1(d.q.size()), o2(d.q.size());
    k.upload(steps.k);
    v.upload(steps.v);
    q.upload(d.q);
    for (uint32_t i = 0; i < steps.n; ++i) {
      const ssa_decode_params p = params(SSA_METHOD_SSA, 600, 10);
      ssa_decode_params pe = p;
      pe.step = p.step + d.n + i;  // a step's RNG step: p.step + the token's position
      ssa_decode_stats se, sp;
      ssa_decode_stats_init(&se);
      ssa_decode_stats_init(&sp);
      REQUIRE(ssa_session_append(eager, 0, k.p + i * row, v.p + i * row, 1) == SSA_OK);
      REQUIRE(ssa_decode(eager, 0, q.p, o1.p, &pe, &se) == SSA_OK);
      const ssa_status st = ssa_decode_step(stepped, 0, k.p + i * row, v.p + i * row, q.p, o2.p, &p, &sp);
      INFO(ssa_last_error_message());
      REQUIRE(st == SSA_OK);
      // The same selection (the step's token encoded on the device with the
      // transform, its query transformed inside the step's kernels).
      CHECK(se.tokens_read == sp.tokens_read);
      CHECK(se.heavy_tokens == sp.heavy_tokens);
      CHECK(se.draws == sp.draws);
      CHECK(se.unique_samples == sp.unique_samples);
      CHECK(se.residual_proxy_mass == sp.residual_proxy_mass);
      CHECK(rel(o2.download(d.q.size()), o1.download(d.q.size())) < 2e-3);
    }
    REQUIRE(ssa_session_sync(stepped, nullptr) == SSA_OK);
    Data all = d;  // the steps' tokens are encoded as appends encode them
    all.n = d.n + steps.n;
    all.k.insert(all.k.end(), steps.k.begin(), steps.k.end());
    REQUIRE(stepped->layers[0].n_tokens == all.n);
    CHECK(compare_codes(stepped, eager, all).differ == 0);
    ssa_session_destroy(stepped);
    ssa_session_destroy(eager);
  }
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu proxies: refused queries and configurations change nothing") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const ProxyCase qpq = kCases[1];
  ssa_session* s = proxy_session(gpu, qpq);
  std::vector<uint16_t> obs = observed_queries(8, 91);
  observe(s, obs, 8, true);
  const QueryMoments before = *s->layers[0].query_moments;
  auto unchanged = [&] {
    CHECK(s->layers[0].query_moments->count == before.count);
    CHECK(s->layers[0].query_moments->sum == before.sum);
    CHECK(s->layers[0].codebooks == nullptr);
  };
  // Host memory on a session that takes device pointers.
  CHECK(ssa_session_observe_queries(s, 0, obs.data(), 8) == SSA_ERR_INVALID_ARGUMENT);
  unchanged();
  // NaN in device queries, named by its index.
  obs[3 * kD + 5] = 0x7e00;
  {
    DevBuf<uint16_t> dq(obs.size());
    dq.upload(obs);
    CHECK(ssa_session_observe_queries(s, 0, dq.p, 8) == SSA_ERR_INVALID_ARGUMENT);
    CHECK(std::string(ssa_last_error_message()).find("NaN") != std::string::npos);
    CHECK(ssa_session_observe_queries(s, 3, dq.p, 8) == SSA_ERR_INVALID_ARGUMENT);  // no such layer
  }
  unchanged();
  ssa_session_destroy(s);
  // A proxy that learns nothing from queries refuses them.
  ssa_session* o = proxy_session(gpu, kCases[0]);
  DevBuf<uint16_t> dq(obs.size());
  CHECK(ssa_session_observe_queries(o, 0, dq.p, 1) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(o->layers[0].query_moments == nullptr);
  ssa_session_destroy(o);
  // Score-aware codebooks are still trained and encoded on the CPU only.
  ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  c.proxy = SSA_PROXY_OPQ;
  c.pq_parallel_weight = 4.0f;
  ssa_session* w = nullptr;
  CHECK(ssa_session_create(gpu, &c, &w) == SSA_ERR_UNSUPPORTED);
  CHECK(w == nullptr);
  CHECK(std::string(ssa_last_error_message()).find("pq_parallel_weight") != std::string::npos);

  // A runtime of several devices (two shards, on one device if it is the only
  // one) takes PQ only: other proxies are refused at create and at load.
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  int32_t devices[2] = {0, gpus > 1 ? 1 : 0};
  ssa::allow_repeated_shard_devices(gpus < 2);
  ssa_runtime_options ro = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  ro.devices = devices;
  ro.n_devices = 2;
  ro.shard_tokens = 8192;
  ssa_runtime* sharded = nullptr;
  const ssa_status rs = ssa_runtime_create(&ro, &sharded);
  ssa::allow_repeated_shard_devices(false);
  INFO(std::string(ssa_last_error_message()));
  REQUIRE(rs == SSA_OK);
  ssa_session* opq = nullptr;
  ssa_session_config oc = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  oc.proxy = SSA_PROXY_OPQ;
  CHECK(ssa_session_create(sharded, &oc, &opq) == SSA_ERR_UNSUPPORTED);
  CHECK(opq == nullptr);
  CHECK(std::string(ssa_last_error_message()).find("several devices") != std::string::npos);
  ssa_session* one = proxy_session(gpu, kCases[0]);  // the same config on one device: fine
  fill(one, make_data(2000, 92), true);
  const std::string path = temp_path("opq_one_device.ssa");
  REQUIRE(ssa_session_save(one, path.c_str()) == SSA_OK);
  ssa_session_destroy(one);
  ssa_session* loaded = nullptr;
  CHECK(ssa_session_load(sharded, path.c_str(), 0, &loaded) == SSA_ERR_UNSUPPORTED);
  CHECK(loaded == nullptr);
  unlink(path.c_str());
  ssa_runtime_destroy(sharded);
  ssa_runtime_destroy(gpu);
}

// A transformed proxy encodes ranges of 1024 tokens or more through a scratch of
// transformed keys (lib/cuda/device_index.cc, encode_range); when the scratch
// cannot be allocated it takes the one-pass kernel instead, which must write the
// same codes. Every device allocation of a training append is failed in turn:
// each failure is refused with SSA_ERR_OUT_OF_MEMORY and leaves the session
// empty, except the scratch's, which the append survives.
TEST_CASE("gpu proxies: a transformed encode without its scratch writes the same codes") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(5000, 61);
  const std::vector<uint16_t> obs = observed_queries(48, 62);
  for (const ProxyCase& pc : kCases) {
    if (!proxy_has_transform(pc.proxy)) continue;
    CAPTURE(pc.name);
    auto make = [&] {
      ssa_session* s = proxy_session(gpu, pc, SSA_SESSION_HOST_POINTERS);
      if (query_aware(pc.proxy)) observe(s, obs, 48, false);
      return s;
    };
    auto append = [&](ssa_session* s) { return ssa_session_append(s, 0, d.k.data(), d.v.data(), d.n); };
    ssa_session* ref = make();
    const uint64_t before = cuda::device_alloc_calls_made();
    REQUIRE(append(ref) == SSA_OK);  // trains at 5000 tokens and encodes them all
    const uint64_t calls = cuda::device_alloc_calls_made() - before;
    const std::vector<uint8_t> want = layer_codes(ref);
    REQUIRE_FALSE(want.empty());

    ssa_session* s = make();
    uint64_t n = 1;
    for (; n <= calls; ++n) {
      cuda::set_device_alloc_failure_countdown(n, false);
      const ssa_status st = append(s);
      cuda::set_device_alloc_failure_countdown(0, false);
      if (st == SSA_OK) break;
      INFO("device allocation ", n, " of ", calls, ": ", ssa_last_error_message());
      REQUIRE(st == SSA_ERR_OUT_OF_MEMORY);
      REQUIRE(ssa_session_length(s) == 0);
    }
    MESSAGE(std::string(pc.name), ": the append survived the failure of device allocation ", n, " of ", calls);
    CHECK(n <= calls);  // one failure was survived: the scratch's
    CHECK(layer_codes(s) == want);
    for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_SSA})
      CHECK(decode(s, d, params(m, 700, 5), false) == decode(ref, d, params(m, 700, 5), false));
    ssa_session_destroy(s);
    ssa_session_destroy(ref);
  }
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
