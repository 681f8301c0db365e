// Host latency of small appends to one CUDA session while another session's
// decodes are queued on a non-blocking stream: the case of a service that feeds
// one conversation while others decode. An append that synchronises the whole
// device waits for every queued decode; one ordered on its own work does not.
//
//   gpu_append_latency_bench [--context N] [--fed F] [--queued Q] [--reps R] [--tokens T]
//
// Prints, for appends of T tokens to a session of F tokens (medians over R
// repetitions): the latency with the device idle, the latency with Q decodes of
// the other session (N tokens, SSA 50x) just queued, and how long that queue
// then took to drain; then one decode step of the appended session alone: a
// T-token append, an SSA 50x decode queued (host time until ssa_decode returns)
// and the wait for its output; and the same step with the append queued on the
// decode's stream (ssa_session_append_async) instead.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "bench_util.h"
#include "ssa.h"

namespace {

constexpr uint32_t kNq = 16, kNkv = 4, kD = 256;  // the paper's shape, f16

__global__ void fill_kernel(__half* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = __float2half(static_cast<float>(x >> 40) / static_cast<float>(1u << 24) * 2.f - 1.f);
  }
}

#define CHECK_CUDA(x)                                                          \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                 \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

using ssa_bench::check;
using ssa_bench::median;
using ssa_bench::now_us;

ssa_session* make_session(ssa_runtime* rt) {
  const ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  ssa_session* s = nullptr;
  check(ssa_session_create(rt, &c, &s), "session");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t context = 262144, fed_tokens = 4096;
  int queued = 16, reps = 50;
  uint32_t tokens = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--context")) context = strtoull(argv[i + 1], nullptr, 10);
    else if (!strcmp(argv[i], "--fed")) fed_tokens = strtoull(argv[i + 1], nullptr, 10);
    else if (!strcmp(argv[i], "--queued")) queued = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tokens")) tokens = static_cast<uint32_t>(atoi(argv[i + 1]));
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  ssa_runtime* rt = nullptr;
  check(ssa_runtime_create(&o, &rt), "runtime");

  // K/V source rows on the device: one chunk, appended repeatedly.
  const uint64_t chunk = 32768;
  const size_t row = size_t{kNkv} * kD;
  __half *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  CHECK_CUDA(cudaMalloc(&k, chunk * row * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&v, chunk * row * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&q, size_t{kNq} * kD * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(queued) * kNq * kD * sizeof(__half)));
  fill_kernel<<<1024, 256>>>(k, chunk * row, 1);
  fill_kernel<<<1024, 256>>>(v, chunk * row, 2);
  fill_kernel<<<16, 256>>>(q, size_t{kNq} * kD, 3);
  CHECK_CUDA(cudaDeviceSynchronize());

  ssa_session* busy = make_session(rt);  // its decodes fill the other stream
  for (uint64_t n = 0; n < context; n += chunk)
    check(ssa_session_append(busy, 0, k, v, std::min(chunk, context - n)), "fill");
  ssa_session* fed = make_session(rt);   // the one appended to
  for (uint64_t n = 0; n < fed_tokens; n += chunk)
    check(ssa_session_append(fed, 0, k, v, std::min(chunk, fed_tokens - n)), "fill");

  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = SSA_METHOD_SSA;
  p.sparsity = 50;
  p.stream = st;
  check(ssa_decode(busy, 0, q, out, &p, nullptr), "decode");  // trains nothing new; uploads tables
  check(ssa_decode(fed, 0, q, out, &p, nullptr), "decode");
  CHECK_CUDA(cudaStreamSynchronize(st));

  std::vector<double> idle, loaded, drain;
  uint64_t src = 0;
  auto next_rows = [&] {  // offset of the next tokens to append, cycling through the chunk
    const size_t at = src * row;
    src = (src + tokens) % (chunk - tokens);
    return at;
  };
  auto append = [&] {
    const size_t at = next_rows();
    check(ssa_session_append(fed, 0, k + at, v + at, tokens), "append");
  };
  for (int r = 0; r < reps; ++r) {
    double t0 = now_us();
    append();
    idle.push_back(now_us() - t0);
    for (int i = 0; i < queued; ++i)
      check(ssa_decode(busy, 0, q, out + static_cast<size_t>(i) * kNq * kD, &p, nullptr), "decode");
    t0 = now_us();
    append();
    loaded.push_back(now_us() - t0);
    CHECK_CUDA(cudaStreamSynchronize(st));
    drain.push_back(now_us() - t0);
  }
  // Decode steps of the fed session: append, queue a decode, wait for it.
  std::vector<double> issue, step;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_us();
    append();
    const double t1 = now_us();
    check(ssa_decode(fed, 0, q, out, &p, nullptr), "decode");
    issue.push_back(now_us() - t1);
    CHECK_CUDA(cudaStreamSynchronize(st));
    step.push_back(now_us() - t0);
  }
  // The same steps with the append queued on the stream.
  std::vector<double> async_issue, async_step;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_us();
    const size_t at = next_rows();
    check(ssa_session_append_async(fed, 0, k + at, v + at, tokens, st), "append_async");
    async_issue.push_back(now_us() - t0);
    check(ssa_decode(fed, 0, q, out, &p, nullptr), "decode");
    CHECK_CUDA(cudaStreamSynchronize(st));
    async_step.push_back(now_us() - t0);
  }
  printf("append of %u token(s) to a %llu-token session, medians of %d:\n", tokens,
         static_cast<unsigned long long>(fed_tokens), reps);
  printf("  device idle:                                   %8.1f us\n", median(idle));
  printf("  %2d SSA decodes of a %llu-token session queued: %8.1f us (queue drained after %.1f us)\n", queued,
         static_cast<unsigned long long>(context), median(loaded), median(drain));
  printf("  decode step (append, SSA 50x decode, wait):    %8.1f us (ssa_decode returned after %.1f us)\n",
         median(step), median(issue));
  printf("  the same, append queued on the decode's stream:  %8.1f us (ssa_session_append_async returned after %.1f us)\n",
         median(async_step), median(async_issue));
  cudaStreamDestroy(st);
  ssa_session_destroy(fed);
  ssa_session_destroy(busy);
  ssa_runtime_destroy(rt);
  return 0;
}
