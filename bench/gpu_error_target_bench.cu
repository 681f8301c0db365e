// Error-targeted SSA against fixed-budget SSA at equal mean error, on the GPU,
// through the public API: one CUDA session of the paper's shape (16 q heads, 4
// KV heads, head dim 256, f16), 1M tokens by default, batch 1.
//
// Data (generated on the device): Gaussian keys and values; queries of norm
// ~2.5 sqrt(d), so attention is neither flat nor a few spikes; one token in 64
// is a needle towards one q head of its KV group, each head's in turn (about 10
// logits above its background), so every head has a heavy set to find. The
// reference of every step is our dense decode (f16 output; its own error,
// ~1e-3, is far below the targets).
//
// For each target epsilon (and delta 0.1), at steps 0..steps-1 (other Philox
// draws, the same query):
//   targeted: ssa_decode with target_error = epsilon (max_budget: N / 5, the
//     default), stats on; per call: host wall time around the call plus a stream
//     synchronisation (the call waits between its rounds anyway), the rounds,
//     the mean budget per head (target_budget / heads), capped heads, and the
//     achieved relative error of every head against dense;
//   fixed: SSA at the fixed budget whose mean relative error over the same steps
//     equals the targeted mean error (bisection on the budget in log space), then
//     timed as the targeted one (wall time per synchronised call) and as a
//     queued decode (CUDA events over back-to-back calls, no stats).
// Output: one JSON object per line (records "meta", "targeted", "fixed") on
// stdout and, with --out FILE, also into FILE.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.h"
#include "lib/cuda/targeted_rounds.h"
#include "cuda_check.cuh"

namespace {

constexpr uint32_t kNq = 16, kNkv = 4, kD = 256;

__device__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A standard normal from the counter (Box-Muller on two hashed uniforms).
__device__ float gauss(uint64_t seed, uint64_t i) {
  const uint64_t a = mix64(seed * 0x9e3779b97f4a7c15ull + 2 * i), b = mix64(a + 2 * i + 1);
  const float u1 = (static_cast<float>(a >> 40) + 1.0f) / 16777217.0f;
  const float u2 = static_cast<float>(b >> 40) / 16777216.0f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// K and V of tokens [0, n), token-major [n][kNkv][kD]; q: [kNq][kD] (float).
__global__ void fill_kv(__half* k, __half* v, const float* q, uint64_t n, uint64_t seed) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i >= n * kNkv * kD) return;
  const uint64_t t = i / (kNkv * kD);
  const uint32_t h = static_cast<uint32_t>(i / kD % kNkv), j = static_cast<uint32_t>(i % kD);
  const uint64_t r = mix64(seed ^ (t * 0x2545f4914f6cdd1dull));
  const bool needle = r % 64 == 0;
  const uint32_t toward = h * (kNq / kNkv) + static_cast<uint32_t>((r >> 8) % (kNq / kNkv));
  float x = gauss(seed, 2 * i);
  if (needle) x += 0.15f * q[toward * kD + j];
  k[i] = __float2half_rn(x);
  v[i] = __float2half_rn(gauss(seed + 1, 2 * i + 1));
}

FILE* g_out = nullptr;
void emit(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
  if (g_out) {
    fprintf(g_out, "%s\n", line.c_str());
    fflush(g_out);
  }
}

struct Setup {
  ssa_runtime* rt = nullptr;
  ssa_session* s = nullptr;
  __half* q = nullptr;    // device
  __half* out = nullptr;  // device
  cudaStream_t stream = nullptr;
  uint64_t n = 0;
};

std::vector<float> download(const Setup& st) {
  std::vector<__half> h(kNq * kD);
  CUDA_OK(cudaMemcpy(h.data(), st.out, h.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = __half2float(h[i]);
  return f;
}

// Relative L2 error of every head of `got` against `ref`.
void head_errors(const std::vector<float>& got, const std::vector<float>& ref, std::vector<double>* errs) {
  for (uint32_t h = 0; h < kNq; ++h) {
    double num = 0, den = 0;
    for (uint32_t j = 0; j < kD; ++j) {
      const double a = got[h * kD + j], b = ref[h * kD + j];
      num += (a - b) * (a - b);
      den += b * b;
    }
    errs->push_back(sqrt(num / den));
  }
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / static_cast<double>(v.size());
}

ssa_decode_params base_params(const Setup& st, uint64_t step) {
  ssa_decode_params p;
  ssa_decode_params_init(&p);
  p.method = SSA_METHOD_SSA;
  p.step = step;
  p.stream = st.stream;
  return p;
}

// One synchronised call: wall milliseconds.
double timed_call(const Setup& st, const ssa_decode_params& p, ssa_decode_stats* stats) {
  const double t0 = ssa_bench::now_us();
  ssa_bench::check(ssa_decode(st.s, 0, st.q, st.out, &p, stats), "ssa_decode");
  CUDA_OK(cudaStreamSynchronize(st.stream));
  return (ssa_bench::now_us() - t0) / 1000.0;
}

// Mean relative error of fixed-budget SSA over steps [0, steps).
double fixed_mean_error(const Setup& st, uint32_t budget, int steps, const std::vector<std::vector<float>>& refs) {
  std::vector<double> errs;
  for (int s = 0; s < steps; ++s) {
    ssa_decode_params p = base_params(st, static_cast<uint64_t>(s));
    p.budget = budget;
    timed_call(st, p, nullptr);
    head_errors(download(st), refs[0], &errs);
  }
  return mean(errs);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1u << 20;
  int steps = 16;
  std::vector<double> eps_list = {0.05, 0.1, 0.2};
  ssa_method method = SSA_METHOD_SSA;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--out" && v) {
      g_out = fopen(v, "w");
      if (!g_out) {
        fprintf(stderr, "cannot write %s\n", v);
        return 1;
      }
      ++i;
    } else if (a == "--tokens" && v) {
      n = strtoull(v, nullptr, 10);
      ++i;
    } else if (a == "--steps" && v) {
      steps = atoi(v);
      ++i;
    } else if (a == "--adaptive") {
      method = SSA_METHOD_SSA_ADAPTIVE;
    } else if (a == "--eps" && v) {
      eps_list.clear();
      for (const char* c = v; *c;) {
        eps_list.push_back(strtod(c, const_cast<char**>(&c)));
        if (*c == ',') ++c;
      }
      ++i;
    } else {
      fprintf(stderr,
              "usage: gpu_error_target_bench [--out FILE] [--tokens N] [--steps S] [--eps 0.05,0.1,0.2] "
              "[--adaptive]\n");
      return 2;
    }
  }
  if (n < 4096 || steps < 2 || eps_list.empty()) {
    fprintf(stderr, "need --tokens >= 4096, --steps >= 2 and at least one epsilon\n");
    return 2;
  }
  Setup st;
  st.n = n;
  const ssa_runtime_options o = ssa_test::runtime_options(SSA_BACKEND_CUDA);
  ssa_bench::check(ssa_runtime_create(&o, &st.rt), "ssa_runtime_create");
  const ssa_session_config c = ssa_test::make_config(1, kNq, kNkv, kD, SSA_DTYPE_F16);
  ssa_bench::check(ssa_session_create(st.rt, &c, &st.s), "ssa_session_create");
  CUDA_OK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
  // The query (host, fixed seed), then K/V on the device.
  std::vector<float> qf(kNq * kD);
  {
    uint64_t x = 12345;
    for (size_t i = 0; i < qf.size(); i += 2) {
      auto u = [&]() {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
      };
      const double r = sqrt(-2.0 * log(u())), a = 2.0 * M_PI * u();
      qf[i] = static_cast<float>(2.5 * r * cos(a));
      qf[i + 1] = static_cast<float>(2.5 * r * sin(a));
    }
  }
  std::vector<__half> qh(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) qh[i] = __float2half_rn(qf[i]);
  float* qf_dev = nullptr;
  __half *k = nullptr, *v = nullptr;
  const size_t elems = size_t{n} * kNkv * kD;
  CUDA_OK(cudaMalloc(&qf_dev, qf.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&st.q, qh.size() * sizeof(__half)));
  CUDA_OK(cudaMalloc(&st.out, qh.size() * sizeof(__half)));
  CUDA_OK(cudaMemcpy(st.q, qh.data(), qh.size() * sizeof(__half), cudaMemcpyHostToDevice));
  // The kernel adds the needle direction from the f16-rounded query, as decoded.
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = __half2float(qh[i]);
  CUDA_OK(cudaMemcpy(qf_dev, qf.data(), qf.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&k, elems * sizeof(__half)));
  CUDA_OK(cudaMalloc(&v, elems * sizeof(__half)));
  fill_kv<<<static_cast<unsigned>((elems + 255) / 256), 256>>>(k, v, qf_dev, n, 777);
  CUDA_OK(cudaDeviceSynchronize());
  ssa_bench::check(ssa_session_append(st.s, 0, k, v, n), "ssa_session_append");
  CUDA_OK(cudaFree(k));
  CUDA_OK(cudaFree(v));
  ssa_bench::check(ssa_session_update_index(st.s), "ssa_session_update_index");

  // Dense reference (the query is the same at every step).
  std::vector<std::vector<float>> refs(1);
  {
    ssa_decode_params p = base_params(st, 0);
    p.method = SSA_METHOD_DENSE;
    timed_call(st, p, nullptr);
    refs[0] = download(st);
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  emit("{\"record\":\"meta\",\"device\":\"" + std::string(prop.name) + "\",\"tokens\":" + std::to_string(n) +
       ",\"shape\":\"16q/4kv/d256/f16\",\"batch\":1,\"steps\":" + std::to_string(steps) + ",\"method\":\"" +
       (method == SSA_METHOD_SSA ? "ssa" : "ssa_adaptive") + "\",\"delta\":0.1}");

  char buf[1024];
  for (double eps : eps_list) {
    // Error-targeted.
    std::vector<double> errs, ms, rounds, budget, capped;
    for (int s = 0; s < steps + 1; ++s) {
      ssa_decode_params p = base_params(st, static_cast<uint64_t>(s));
      p.method = method;
      p.target_error = static_cast<float>(eps);
      p.target_delta = 0.1f;
      ssa_decode_stats stats;
      ssa_decode_stats_init(&stats);
      const double t = timed_call(st, p, &stats);
      if (s == 0) continue;  // warm-up (allocations of the first call)
      ms.push_back(t);
      rounds.push_back(ssa::cuda::last_targeted_rounds());
      budget.push_back(static_cast<double>(stats.target_budget) / kNq);
      capped.push_back(stats.capped_heads);
      head_errors(download(st), refs[0], &errs);
    }
    const double target_mean_err = mean(errs);
    size_t within = 0;
    for (double e : errs) within += e <= eps ? 1 : 0;
    snprintf(buf, sizeof buf,
             "{\"record\":\"targeted\",\"eps\":%g,\"ms_median\":%.4f,\"ms_mean\":%.4f,\"rounds_mean\":%.3f,"
             "\"rounds_max\":%.0f,\"budget_per_head_mean\":%.1f,\"capped_heads_mean\":%.3f,"
             "\"mean_rel_error\":%.5f,\"coverage\":%.4f}",
             eps, ssa_bench::median(ms), mean(ms), mean(rounds), *std::max_element(rounds.begin(), rounds.end()),
             mean(budget), mean(capped), target_mean_err, static_cast<double>(within) / errs.size());
    emit(buf);

    // The fixed budget of equal mean error: the error falls with the budget, so
    // bisect log(budget) between 2 * (sink + local) and N / 5.
    double lo = 512, hi = static_cast<double>(n) / 5;
    double err_lo = fixed_mean_error(st, static_cast<uint32_t>(lo), steps, refs);
    double err_hi = fixed_mean_error(st, static_cast<uint32_t>(hi), steps, refs);
    for (int it = 0; it < 10 && err_lo > target_mean_err && err_hi < target_mean_err; ++it) {
      const double mid = sqrt(lo * hi);
      const double e = fixed_mean_error(st, static_cast<uint32_t>(mid), steps, refs);
      if (e > target_mean_err) {
        lo = mid;
        err_lo = e;
      } else {
        hi = mid;
        err_hi = e;
      }
    }
    // The smallest probed budget at or under the targeted mean error.
    const uint32_t fixed_budget = static_cast<uint32_t>(err_lo <= target_mean_err ? lo : hi);
    const double fixed_err = err_lo <= target_mean_err ? err_lo : err_hi;
    std::vector<double> fms;
    for (int s = 0; s < steps + 1; ++s) {
      ssa_decode_params p = base_params(st, static_cast<uint64_t>(s));
      p.budget = fixed_budget;
      const double t = timed_call(st, p, nullptr);
      if (s > 0) fms.push_back(t);
    }
    // Queued: back-to-back decodes between two events.
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    const int reps = 20;
    CUDA_OK(cudaEventRecord(e0, st.stream));
    for (int r = 0; r < reps; ++r) {
      ssa_decode_params p = base_params(st, static_cast<uint64_t>(r));
      p.budget = fixed_budget;
      ssa_bench::check(ssa_decode(st.s, 0, st.q, st.out, &p, nullptr), "ssa_decode");
    }
    CUDA_OK(cudaEventRecord(e1, st.stream));
    CUDA_OK(cudaEventSynchronize(e1));
    float queued_ms = 0;
    CUDA_OK(cudaEventElapsedTime(&queued_ms, e0, e1));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    snprintf(buf, sizeof buf,
             "{\"record\":\"fixed\",\"eps\":%g,\"budget\":%u,\"mean_rel_error\":%.5f,\"targeted_mean_rel_error\":%.5f,"
             "\"ms_median\":%.4f,\"ms_queued\":%.4f,\"targeted_over_fixed_ms\":%.3f}",
             eps, fixed_budget, fixed_err, target_mean_err, ssa_bench::median(fms), queued_ms / reps,
             ssa_bench::median(ms) / ssa_bench::median(fms));
    emit(buf);
  }
  cudaFree(qf_dev);
  cudaFree(st.q);
  cudaFree(st.out);
  ssa_session_destroy(st.s);
  ssa_runtime_destroy(st.rt);
  cudaStreamDestroy(st.stream);
  if (g_out) fclose(g_out);
  return 0;
}
