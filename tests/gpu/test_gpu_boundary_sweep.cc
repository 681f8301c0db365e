// The boundary sweep (tests/support/boundary_sweep.h) on the CUDA backend, with
// K/V, q and out in device memory and every other append queued on a stream
// (ssa_session_append_async): every method x dtype x head dim x GQA ratio, from
// one token through a page, the window, the index threshold and a sampler chunk,
// budgets around each boundary, against float64 references. Short contexts with
// a budget below the window once scored candidates through a layer that had no
// index; run it under compute-sanitizer memcheck too (scripts/gpu.sh sanitize).
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <stdlib.h>

#include "support/boundary_sweep.h"
#include "support/gpu_layer.h"
#include "support/gpu_sessions.h"

namespace ssa::gputest {
namespace {

using ssa_test::sweep::Io;

DevBuf<uint8_t> to_device(const std::vector<uint8_t>& b) {
  DevBuf<uint8_t> d(b.size());
  d.upload(b);
  return d;
}

Io gpu_io(ssa_runtime* rt, cudaStream_t stream) {
  Io io;
  io.name = "cuda";
  io.rt = rt;
  io.traced = false;
  io.batch_bitwise = false;
  io.append = [stream](ssa_session* s, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v, uint64_t n,
                       bool async) {
    DevBuf<uint8_t> kd = to_device(k), vd = to_device(v);
    ssa_status st;
    if (async) {
      st = ssa_session_append_async(s, 0, kd.p, vd.p, n, stream);
      CUDA_OK(cudaStreamSynchronize(stream));  // before the buffers go
    } else {
      st = ssa_session_append(s, 0, kd.p, vd.p, n);
    }
    return st;
  };
  io.decode = [](ssa_session* s, const std::vector<uint8_t>& q, std::vector<uint8_t>* out,
                 const ssa_decode_params& p, ssa_decode_stats* st) {
    DevBuf<uint8_t> qd = to_device(q), od(q.size());
    const ssa_status r = ssa_decode(s, 0, qd.p, od.p, &p, st);
    if (r == SSA_OK) *out = od.download(q.size());
    return r;
  };
  io.decode_batch = [](const std::vector<ssa_session*>& ss, const std::vector<uint8_t>& q,
                       std::vector<std::vector<uint8_t>>* outs, const ssa_decode_params& p) {
    DevBuf<uint8_t> qd = to_device(q), od(q.size() * ss.size());
    std::vector<ssa_decode_item> items;
    for (size_t i = 0; i < ss.size(); ++i) items.push_back(ssa_decode_item{ss[i], qd.p, od.p + i * q.size()});
    const ssa_status r = ssa_decode_batch(items.data(), items.size(), 0, &p);
    if (r != SSA_OK) return r;
    const std::vector<uint8_t> all = od.download(q.size() * ss.size());
    outs->clear();
    for (size_t i = 0; i < ss.size(); ++i)
      outs->emplace_back(all.begin() + i * q.size(), all.begin() + (i + 1) * q.size());
    return r;
  };
  return io;
}

TEST_CASE("gpu boundary sweep: short contexts, windows, index threshold and budget edges") {
  SSA_GPU_TEST_OR_SKIP();
  ssa_runtime* rt = runtime(SSA_BACKEND_CUDA);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  {
    const Io io = gpu_io(rt, stream);
    // SSA_SWEEP_MAX_LEN shortens the sweep (the sanitizer's run).
    const char* env = getenv("SSA_SWEEP_MAX_LEN");
    const uint32_t max_len = env != nullptr ? static_cast<uint32_t>(atoi(env)) : 1100u;
    ssa_test::sweep::Tally total;
    uint64_t seed = 1;
    // SSA_SWEEP_DIAGONAL=1: one shape per dtype (the sanitizer's run).
    for (const ssa_test::sweep::Shape& sh : ssa_test::sweep::sweep_shapes()) {
      total += ssa_test::sweep::run_shape(io, sh, max_len, seed++);
}
    ssa_test::sweep::report("cuda", total);
    CHECK(total.window_only > 0);
    CHECK(total.selecting_other > 0);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  ssa_runtime_destroy(rt);
}

}  // namespace
}  // namespace ssa::gputest
