// The CUDA backend through the public C API, against the CPU backend on the same
// data: backend choice, appends from device and (flagged) host pointers, dense
// and oracle top-k decode equal to the CPU's, budget >= N equal to dense for
// every method, stats, determinism, decode_batch over sessions of different
// lengths, fork/truncate, pointer-space errors, NaN/Inf in device K/V, and
// deterministic index training.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "cuda/device_alloc.h"
#include "support/gpu_sessions.h"
#include "support/gpu_layer.h"
#include "ssa.h"

namespace ssa::gputest {
namespace {

TEST_CASE("gpu backend: runtime choice, pointer spaces and decode against the CPU backend") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* auto_rt = runtime(SSA_BACKEND_AUTO);
  CHECK(ssa_runtime_backend(auto_rt) == SSA_BACKEND_CUDA);
  ssa_runtime_destroy(auto_rt);

  ssa_runtime* cpu = runtime(SSA_BACKEND_CPU);
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(9000, 21);
  ssa_session* sc = session(cpu, 0);
  ssa_session* sd = session(gpu, 0);                          // device pointers
  ssa_session* sh = session(gpu, SSA_SESSION_HOST_POINTERS);  // host pointers
  fill(sc, d, false);
  fill(sd, d, true);
  fill(sh, d, false);
  CHECK(ssa_session_length(sd) == d.n);

  // A host pointer without the flag is rejected; the session is unchanged.
  CHECK(ssa_session_append(sd, 0, d.k.data(), d.v.data(), 4) == SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa_session_length(sd) == d.n);
  {
    std::vector<uint16_t> out(kNq * kD);
    const ssa_decode_params p = params(SSA_METHOD_DENSE, 0);
    CHECK(ssa_decode(sd, 0, d.q.data(), out.data(), &p, nullptr) == SSA_ERR_INVALID_ARGUMENT);
  }

  const auto dense_cpu = decode(sc, d, params(SSA_METHOD_DENSE, 0), false);
  const auto dense_dev = decode(sd, d, params(SSA_METHOD_DENSE, 0), true);
  const auto dense_host = decode(sh, d, params(SSA_METHOD_DENSE, 0), false);
  CHECK(rel(dense_dev, dense_cpu) < 2e-3);
  CHECK(dense_host == dense_dev);

  // Oracle top-k reads the same tokens as the CPU (up to ties): same output.
  const auto orc_cpu = decode(sc, d, params(SSA_METHOD_ORACLE_TOPK, 900), false);
  const auto orc_dev = decode(sd, d, params(SSA_METHOD_ORACLE_TOPK, 900), true);
  CHECK(rel(orc_dev, orc_cpu) < 2e-3);
  CHECK(rel(orc_dev, dense_dev) > 1e-4);  // it is sparse, not dense

  // Budget >= N: every method is dense.
  for (ssa_method m : {SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM,
                       SSA_METHOD_SAMPLING, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    INFO("method ", m);
    CHECK(rel(decode(sd, d, params(m, d.n + 10), true), dense_dev) < 1e-6);
  }

  // Every sparse method runs, reads about k tokens per head, and is close to dense.
  for (ssa_method m : {SSA_METHOD_PQ_TOPK, SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING, SSA_METHOD_SSA,
                       SSA_METHOD_SSA_ADAPTIVE}) {
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    const uint32_t k = 1800;
    const auto out = decode(sd, d, params(m, k, 3), true, &st);
    const uint64_t kprime = k - 256;
    INFO("method ", m, " rel err vs dense ", rel(out, dense_dev), " read ", st.tokens_read);
    // Uniform tail sampling has the largest variance on this needle data.
    CHECK(rel(out, dense_dev) < (m == SSA_METHOD_HYBRID_UNIFORM ? 0.45 : 0.35));
    CHECK(st.context_tokens == d.n);
    CHECK(st.tokens_read <= uint64_t{k} * kNq);
    CHECK(st.tokens_read >= uint64_t{256} * kNq);
    CHECK(st.scored_tokens == (d.n - 256) * kNq);
    if (m == SSA_METHOD_PQ_TOPK) CHECK(st.heavy_tokens == kprime * kNq);
    if (m == SSA_METHOD_SSA) {
      const uint64_t h = static_cast<uint64_t>(nearbyint(0.4 * kprime));
      CHECK(st.heavy_tokens == h * kNq);
      CHECK(st.draws == (kprime - h) * kNq);
      CHECK(st.unique_samples > 0);
      CHECK(st.unique_samples <= st.draws);
      CHECK(st.residual_proxy_mass > 0);
    }
    // Same step: bitwise the same; another step: different samples.
    const auto again = decode(sd, d, params(m, k, 3), true);
    CHECK(again == out);
    if (m != SSA_METHOD_PQ_TOPK) CHECK(decode(sd, d, params(m, k, 4), true) != out);
  }

  // Fork then append to the fork: the source is unchanged.
  ssa_session* f = nullptr;
  REQUIRE(ssa_session_fork(sd, &f) == SSA_OK);
  fill(f, make_data(300, 5), true);
  CHECK(ssa_session_length(f) == d.n + 300);
  CHECK(decode(sd, d, params(SSA_METHOD_DENSE, 0), true) == dense_dev);
  REQUIRE(ssa_session_truncate(f, d.n) == SSA_OK);
  CHECK(rel(decode(f, d, params(SSA_METHOD_DENSE, 0), true), dense_dev) < 1e-6);
  ssa_session_destroy(f);

  ssa_session_destroy(sc);
  ssa_session_destroy(sd);
  ssa_session_destroy(sh);
  ssa_runtime_destroy(cpu);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu backend: decode_batch over sessions of different lengths equals single decodes") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const uint32_t lens[3] = {5000, 700, 12000};
  std::vector<Data> data;
  std::vector<ssa_session*> ss;
  for (int i = 0; i < 3; ++i) {
    data.push_back(make_data(lens[i], 100 + i));
    ss.push_back(session(gpu, SSA_SESSION_HOST_POINTERS));
    fill(ss.back(), data.back(), false);
  }
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_PQ_TOPK}) {
    ssa_decode_params p = params(m, 600, 9);
    std::vector<std::vector<uint16_t>> outs(3, std::vector<uint16_t>(kNq * kD, 0xffff));
    std::vector<ssa_decode_item> items(3);
    for (int i = 0; i < 3; ++i) items[i] = ssa_decode_item{ss[i], data[i].q.data(), outs[i].data()};
    REQUIRE(ssa_decode_batch(items.data(), 3, 0, &p) == SSA_OK);
    for (int i = 0; i < 3; ++i) {
      INFO("method ", m, " item ", i);
      CHECK(rel(outs[i], decode(ss[i], data[i], p, false)) < 2e-3);
    }
  }
  for (auto* s : ss) ssa_session_destroy(s);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu backend: ssa_decode on a stream is captured into a CUDA graph and replays") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(6000, 77);
  ssa_session* s = session(gpu, 0);
  fill(s, d, true);
  cudaStream_t st;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  DevBuf<uint16_t> q(d.q.size()), out(kNq * kD);
  q.upload(d.q);
  for (ssa_method m : {SSA_METHOD_DENSE, SSA_METHOD_SSA, SSA_METHOD_SSA_ADAPTIVE}) {
    ssa_decode_params p = params(m, 700, 11);
    p.stream = st;
    // A first decode uploads the page tables and codebooks; later ones only enqueue.
    REQUIRE(ssa_decode(s, 0, q.p, out.p, &p, nullptr) == SSA_OK);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    const auto ref = out.download(out.n);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess);
    const ssa_status captured = ssa_decode(s, 0, q.p, out.p, &p, nullptr);
    const std::string msg = ssa_last_error_message();
    REQUIRE(cudaStreamEndCapture(st, &graph) == cudaSuccess);
    INFO("method ", m, ": ", msg);
    REQUIRE(captured == SSA_OK);
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    for (int rep = 0; rep < 3; ++rep) {
      REQUIRE(cudaMemsetAsync(out.p, 0xff, out.n * 2, st) == cudaSuccess);
      REQUIRE(cudaGraphLaunch(exec, st) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
      CHECK(out.download(out.n) == ref);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(st);
  ssa_session_destroy(s);
  ssa_runtime_destroy(gpu);
}

TEST_CASE("gpu backend: NaN or infinity in device k or v is refused, naming the first, the layer unchanged") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  struct Kind {
    ssa_dtype api;
    DType t;
    uint32_t nan, inf, neg_inf;  // bit patterns
  };
  const Kind kinds[] = {{SSA_DTYPE_F16, DType::kF16, 0x7E00u, 0x7C00u, 0xFC00u},
                        {SSA_DTYPE_BF16, DType::kBF16, 0x7FC0u, 0x7F80u, 0xFF80u},
                        {SSA_DTYPE_F32, DType::kF32, 0x7FC00001u, 0x7F800000u, 0xFF800000u}};
  std::mt19937_64 rng(77);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (const Kind& kd : kinds) {
    INFO("dtype ", kd.api);
    ssa_session* s = session(gpu, 0, kd.api);  // device pointers
    const uint32_t n = 300;
    const size_t elems = size_t{n} * kNkv * kD, eb = dtype_bytes(kd.t);
    std::vector<uint8_t> k(elems * eb), v(elems * eb);
    for (size_t i = 0; i < elems; ++i) {
      store_from_f32(k.data(), kd.t, i, nd(rng));
      store_from_f32(v.data(), kd.t, i, nd(rng));
    }
    DevBuf<uint8_t> dk(k.size()), dv(v.size());
    dk.upload(k);
    dv.upload(v);
    REQUIRE(ssa_session_append(s, 0, dk.p, dv.p, n) == SSA_OK);
    REQUIRE(ssa_session_length(s) == n);
    // One bad element at `at` and another further on: the first is named. The
    // array starts at a 16-byte boundary or one element past it (the scan reads
    // the elements before the first boundary one by one).
    const size_t positions[] = {0, 2, elems / 2 + 3, elems - 1};
    for (bool in_v : {false, true}) {
      for (uint32_t bits : {kd.nan, kd.inf, kd.neg_inf}) {
        for (size_t at : positions) {
          for (size_t offset : {size_t{0}, size_t{1}}) {
            INFO((in_v ? "v[" : "k["), at, "] bits ", bits, " offset ", offset);
            std::vector<uint8_t> bad(offset * eb);
            bad.insert(bad.end(), (in_v ? v : k).begin(), (in_v ? v : k).end());
            for (size_t i : {at, std::min(elems - 1, at + 5)}) memcpy(bad.data() + (offset + i) * eb, &bits, eb);
            DevBuf<uint8_t> db(bad.size());
            db.upload(bad);
            const uint8_t* p = db.p + offset * eb;
            const ssa_status st = ssa_session_append(s, 0, in_v ? dk.p : p, in_v ? p : dk.p, n);
            const std::string msg = ssa_last_error_message();
            CHECK(st == SSA_ERR_INVALID_ARGUMENT);
            CHECK(msg.find(std::string(in_v ? "v[" : "k[") + std::to_string(at) + "] is NaN or infinite") !=
                  std::string::npos);
            CHECK(ssa_session_length(s) == n);
          }
        }
      }
    }
    // The layer still takes finite tokens after the refusals.
    REQUIRE(ssa_session_append(s, 0, dk.p, dv.p, n) == SSA_OK);
    CHECK(ssa_session_length(s) == 2 * n);
    // An append of more pages than one copy launch takes (64 of 128 tokens): a
    // bad element in the second launch is named by its index in the whole array.
    {
      const uint32_t big = 9000;
      const size_t big_elems = size_t{big} * kNkv * kD;
      std::vector<uint8_t> bk(big_elems * eb);
      for (size_t i = 0; i < big_elems; ++i) store_from_f32(bk.data(), kd.t, i, nd(rng));
      const size_t at = size_t{8300} * kNkv * kD + 3;  // token 8300: pages 64 on
      memcpy(bk.data() + at * eb, &kd.nan, eb);
      DevBuf<uint8_t> dbk(bk.size());
      dbk.upload(bk);
      CHECK(ssa_session_append(s, 0, dbk.p, dbk.p, big) == SSA_ERR_INVALID_ARGUMENT);
      CHECK(std::string(ssa_last_error_message()).find("k[" + std::to_string(at) + "] is NaN or infinite") !=
            std::string::npos);
      CHECK(ssa_session_length(s) == 2 * n);
    }
    ssa_session_destroy(s);
  }
  ssa_runtime_destroy(gpu);
}

// Two sessions fed the same keys train the same codebooks on the GPU, and a
// retraining over the same keys gives them again: SSA's output, which moves with
// any bit of a table entry (proxy weights, inclusion probabilities), is bitwise
// the same.
TEST_CASE("gpu backend: index training on the GPU gives the same codebooks every time") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  const Data d = make_data(40000, 41);
  ssa_session* a = session(gpu, 0);
  ssa_session* b = session(gpu, 0);
  fill(a, d, true);  // trained during the first append (index_min_tokens 1024)
  fill(b, d, true);
  const ssa_decode_params ssa = params(SSA_METHOD_SSA, 900, 3), pq = params(SSA_METHOD_PQ_TOPK, 900, 3);
  CHECK(decode(a, d, ssa, true) == decode(b, d, ssa, true));
  CHECK(decode(a, d, pq, true) == decode(b, d, pq, true));
  REQUIRE(ssa_session_update_index(a) == SSA_OK);  // retrained over 16384 of the 40000 tokens
  REQUIRE(ssa_session_update_index(b) == SSA_OK);
  const auto out = decode(a, d, ssa, true);
  CHECK(decode(b, d, ssa, true) == out);
  REQUIRE(ssa_session_update_index(a) == SSA_OK);
  CHECK(decode(a, d, ssa, true) == out);
  ssa_session_destroy(a);
  ssa_session_destroy(b);
  ssa_runtime_destroy(gpu);
}


// The library allocates device memory from a pool of its own that keeps what is
// freed across waits (the device's default pool gives it back at every
// synchronisation, and each decode after a wait mapped its workspace again),
// gives it back on request, and is left holding nothing once the sessions are
// gone.
TEST_CASE("gpu backend: the device pool keeps freed memory across waits and holds none after the sessions") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* gpu = runtime(SSA_BACKEND_CUDA);
  // What earlier tests left in the pool (nothing, once all is done) is the baseline.
  CUDA_OK(cudaDeviceSynchronize());
  cuda::device_pool_trim();
  const uint64_t used0 = cuda::device_pool_bytes(true), reserved0 = cuda::device_pool_bytes(false);
  ssa_session* s = session(gpu, 0);
  const Data d = make_data(20000, 43);
  fill(s, d, true);
  const auto before = decode(s, d, params(SSA_METHOD_SSA, 900, 3), true);
  CUDA_OK(cudaDeviceSynchronize());
  const uint64_t used = cuda::device_pool_bytes(true);
  CHECK(used > used0);  // the session's pages

  const size_t big = size_t{64} << 20;
  void* p = nullptr;
  REQUIRE(cuda::device_malloc_async(&p, big, nullptr) == cudaSuccess);
  CHECK(cuda::device_pool_bytes(true) >= used + big);
  CUDA_OK(cudaFreeAsync(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const uint64_t kept = cuda::device_pool_bytes(false);
  CHECK(cuda::device_pool_bytes(true) == used);
  CHECK(kept >= used + big);  // freed, synchronised, still held for reuse
  cuda::device_pool_trim();
  CHECK(cuda::device_pool_bytes(false) + big <= kept);  // given back
  CHECK(decode(s, d, params(SSA_METHOD_SSA, 900, 3), true) == before);

  ssa_session_destroy(s);  // waits for its frees and trims the pool
  CHECK(cuda::device_pool_bytes(true) == used0);  // every page, table and workspace freed
  CHECK(cuda::device_pool_bytes(false) <= reserved0);
  ssa_runtime_destroy(gpu);
}

}  // namespace
}  // namespace ssa::gputest
