// GPU decode benchmark matrix. Two model shapes: the paper's (16 q heads, 4 KV
// heads, head dim 256, f16) and Llama-3.1-8B's (32 q, 8 KV, head dim 128, bf16);
// contexts 128K, 512K, 1M; batch 1 and 16; our dense decode once per
// (shape, context, batch), PQ_TOPK and SSA (h = 0.4) at sparsity 10, 20, 50, 100x.
//
// Every batch item is its own session: its own K/V pages, code pages, codebooks
// and query, allocated per (shape, context, batch) and freed before the next.
// One launch set (DecodeBatch) serves the whole batch.
//
// Timing: CUDA events around each decode on the default stream, the L2 flushed
// (256 MiB read) before every timed decode, outside the events; 2 warm-up runs,
// 3 runs to estimate the time, then enough runs for about kTargetMs (10..100);
// the median of those runs is one input set's time. Several input sets (query
// seeds, also the sampling seed); the reported time is the median over them.
// Sparse methods are also timed with events between the stages of the same
// pipeline (init rows + PQ scores | top-k | sampling | compaction of the
// selection bitmaps into lists | attention of the splits | split merge): the
// stage split, medians per stage.
//
// Every decode is also timed replayed from a CUDA graph captured once per input
// set (ms_graph): the kernels without the host's per-kernel launch gaps.
//
// The device-to-device copy bandwidth (cudaMemcpy of 4 GiB, read + write bytes
// per second) is measured first: byte floors are bytes / that bandwidth.
//
// Output: one JSON object per line (records "meta", "copy_bw", "result",
// "error", "fatal"; lines starting with '#' are progress notes) on stdout and,
// with --out FILE, also into FILE. bench/gpu_bench_report.py turns them into
// markdown tables. Built with -DSSA_FLASHINFER_DIR, it also times FlashInfer's
// batch decode over the same pages (bench/flashinfer_decode.h) as a dense
// baseline. SSA_BENCH_PROFILE=1: one untimed decode of each method at 50x,
// for the first of --configs, --contexts and --batches (default: paper shape,
// 1M tokens, batch 1), for a profiler that records every kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda_decode.h"
#include "kernels/pq_index.h"
#include "kernels/stages.h"
#ifdef SSA_WITH_FLASHINFER
#include "flashinfer_decode.h"
#endif

using namespace ssa;
using namespace ssa::cuda;

namespace {

struct ModelShape {
  const char* name;
  uint32_t nq, nkv, d;
  DType dtype;
  const char* dtype_name;
};
const ModelShape kShapes[] = {{"paper", 16, 4, 256, DType::kF16, "f16"},
                              {"llama8b", 32, 8, 128, DType::kBF16, "bf16"}};

constexpr uint32_t kPage = 256, kPageShift = 8;  // tokens per KV page
constexpr uint32_t kSink = 128, kLocal = 128;    // always read, inside the budget k
constexpr float kSsaH = 0.4f;                    // SSA heavy fraction of k - sink - local
constexpr double kTargetMs = 100.0;              // timed decode time per measurement
constexpr int kWarm = 2, kEstimate = 3, kMinReps = 10, kMaxReps = 100;
constexpr size_t kFlushBytes = size_t{256} << 20;

bool g_profile = false;
FILE* g_out = nullptr;
constexpr int kStages = 6;  // score, top-k, sample, lists, attention of the splits, merge
cudaEvent_t g_ev[kStages + 1];
const uint4* g_flush = nullptr;
uint32_t* g_sink = nullptr;
std::chrono::steady_clock::time_point g_start;
double g_budget_s = 270.0;  // later cases are reported as skipped (see --time-budget-s)
uint32_t g_sparse_splits = 0;  // --sparse-splits: attention splits of sparse methods (0 = automatic)
uint32_t g_dense_splits = 0;   // --dense-splits: the same for our dense kernel
bool g_overlap = true;         // --overlap-launches 0: stages launched plainly (stage_launch.cuh)
uint32_t g_pq_m = 16;          // --pq-m: PQ subspaces (16, the library's default; 8 halves the lookups)
// --proxy: pq (8-bit codes, 256 centroids), pq4 (4-bit codes: 16 centroids, twice
// the subspaces at PQ's bytes), opq / qpq and opq4 / qpq4 (the same with a d x d
// query transform before the tables; the two families cost the same to score, so
// one name each stands for both).
uint32_t g_pq_k = 256;
uint32_t g_code_bits = 8;
bool g_transform = false;
std::string g_proxy = "pq";
// --methods: which of dense, pq_topk, ssa, flashinfer run, and the group
// selections pq_topk_gmean, ssa_gmean (mean query), ssa_gmix (mixture), at the
// same budget per q head, only when asked (FlashInfer only when
// asked: scripts/gpu.sh check runs it in a process of its own, so that a fault in
// it cannot take the other results with it).
std::vector<std::string> g_methods = {"dense", "pq_topk", "ssa"};
bool method_on(const char* m) { return std::find(g_methods.begin(), g_methods.end(), m) != g_methods.end(); }

double elapsed_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

// ---- output -------------------------------------------------------------------

void emit_line(const std::string& line) {
  fputs(line.c_str(), stdout);
  fputc('\n', stdout);
  fflush(stdout);
  if (g_out) {
    fputs(line.c_str(), g_out);
    fputc('\n', g_out);
    fflush(g_out);
  }
}

void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  emit_line(std::string("# ") + buf);
}

std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      r += ' ';
    } else {
      r += c;
    }
  }
  return r;
}

// A JSON object built field by field (numbers that are not finite become null).
struct Json {
  std::string s = "{";
  void key(const char* k) {
    if (s.size() > 1) s += ',';
    s += '"';
    s += k;
    s += "\":";
  }
  Json& str(const char* k, const std::string& v) {
    key(k);
    s += '"' + json_escape(v) + '"';
    return *this;
  }
  Json& num(const char* k, double v) {
    key(k);
    char b[64];
    if (isfinite(v)) {
      snprintf(b, sizeof b, "%.6g", v);
    } else {
      snprintf(b, sizeof b, "null");
    }
    s += b;
    return *this;
  }
  Json& integer(const char* k, unsigned long long v) {
    key(k);
    s += std::to_string(v);
    return *this;
  }
  Json& nums(const char* k, const std::vector<double>& v) {
    key(k);
    s += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      char b[64];
      snprintf(b, sizeof b, "%s%.6g", i ? "," : "", isfinite(v[i]) ? v[i] : -1.0);
      s += b;
    }
    s += ']';
    return *this;
  }
  Json& raw(const char* k, const std::string& v) {
    key(k);
    s += v;
    return *this;
  }
  std::string done() const { return s + "}"; }
};

// ---- device data ----------------------------------------------------------------

__device__ __forceinline__ void store_f(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ float load_f(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Roughly normal values (sum of four uniforms), mean 0, variance 1; a different
// stream for every seed.
template <typename T>
__global__ void fill_normalish(T* p, size_t n, uint64_t seed) {
  const uint64_t salt = (seed + 1) * 0xD1B54A32D192ED03ull;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + salt;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 27; x *= 0x94D049BB133111EBull; x ^= x >> 33;
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += static_cast<float>((x >> (16 * k)) & 0xffff) / 65535.f - 0.5f;
    store_f(p + i, s * 1.7320508f);
  }
}

// Centroid c of (KV head h, subspace m) = sub-vector m of the key of token
// 997 * c mod P of the first page (page layout: K as [h][P][d], then V).
template <typename T>
__global__ void fill_books(const T* page0, float* books, uint32_t M, uint32_t K, uint32_t sub, uint32_t d) {
  const uint32_t c = blockIdx.x, m = blockIdx.y, h = blockIdx.z;
  const size_t t = (size_t{997} * c) % kPage;
  for (uint32_t j = threadIdx.x; j < sub; j += blockDim.x)
    books[((size_t{h} * M + m) * K + c) * sub + j] = load_f(page0 + (size_t{h} * kPage + t) * d + m * sub + j);
}

// Row i of every KV head's two d x d matrices (z = 0: T, z = 1: the query's):
// a signed permutation, i -> (5 i + 1) mod d with alternating signs.
__global__ void fill_transform(float* t, uint32_t d) {
  const uint32_t i = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
  float* row = t + ((size_t{z} * gridDim.y + h) * d + i) * d;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
    row[j] = j == (5 * i + 1) % d ? (i % 2 ? -1.0f : 1.0f) : 0.0f;
}

// Code bytes per token per KV head.
uint32_t code_bytes() { return g_code_bits == 4 ? g_pq_m / 2 : g_pq_m; }

// Reads the flush buffer so that the next decode finds none of its data in L2
// (reads, not writes: no dirty lines to write back during the timed decode).
__global__ void l2_flush_read(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads
}

cudaError_t fill(DType dt, void* p, size_t n, uint64_t seed) {
  const unsigned grid = static_cast<unsigned>(std::min<size_t>(4096, (n + 255) / 256));
  if (dt == DType::kF16) {
    fill_normalish<<<grid, 256>>>(static_cast<__half*>(p), n, seed);
  } else {
    fill_normalish<<<grid, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  }
  return cudaGetLastError();
}

// Device allocations freed together (destructor or release()).
struct Arena {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  std::string error;
  void* get(size_t n, const char* what) {
    if (!error.empty()) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      char buf[320];
      snprintf(buf, sizeof buf, "cudaMalloc of %.3f GB (%s) failed after %.2f GB of this case: %s (free %.2f of %.2f GB)",
               n / 1e9, what, bytes / 1e9, cudaGetErrorString(e), fr / 1e9, tot / 1e9);
      error = buf;
      return nullptr;
    }
    ptrs.push_back(p);
    bytes += n;
    return p;
  }
  void release() {
    for (void* p : ptrs) cudaFree(p);
    ptrs.clear();
    bytes = 0;
  }
  ~Arena() { release(); }
};

// One session's data on the device.
struct Session {
  uint8_t* kv = nullptr;
  uint8_t* codes = nullptr;
  const uint8_t** kv_table = nullptr;  // device array of page pointers
  uint8_t** code_table = nullptr;
  float* books = nullptr;
  const float* query_transform = nullptr;  // inside books (--proxy opq, qpq, ...), else null
  void* q = nullptr;
  void* out = nullptr;
};

// After a failed call: clears a non-sticky error; false when the context is lost.
bool context_ok() {
  cudaGetLastError();
  const cudaError_t e = cudaDeviceSynchronize();
  cudaGetLastError();
  return e == cudaSuccess;
}

[[noreturn]] void fatal(const std::string& msg) {
  emit_line(Json().str("rec", "fatal").str("src", "ours").str("error", msg).done());
  exit(3);
}

// ---- timing -----------------------------------------------------------------------

using ssa_bench::median;

struct Timing {
  std::vector<double> med;  // median of each span between consecutive events
  int reps = 0;
};

// f enqueues one decode on the default stream and records ev[0] .. ev[n_ev - 1]
// at its stage boundaries (ev[0] first). The L2 flush goes before ev[0].
cudaError_t measure(const std::function<cudaError_t(cudaEvent_t*)>& f, int n_ev, Timing* out) {
  std::vector<std::vector<double>> spans(n_ev - 1);
  auto once = [&](bool keep, double* total) -> cudaError_t {
    l2_flush_read<<<1024, 256>>>(g_flush, kFlushBytes / sizeof(uint4), g_sink);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if ((e = f(g_ev)) != cudaSuccess) return e;
    if ((e = cudaEventSynchronize(g_ev[n_ev - 1])) != cudaSuccess) return e;
    double sum = 0.0;
    for (int i = 0; i + 1 < n_ev; ++i) {
      float ms = 0.f;
      if ((e = cudaEventElapsedTime(&ms, g_ev[i], g_ev[i + 1])) != cudaSuccess) return e;
      if (keep) spans[i].push_back(ms);
      sum += ms;
    }
    if (total) *total = sum;
    return cudaSuccess;
  };
  cudaError_t e;
  for (int i = 0; i < kWarm; ++i)
    if ((e = once(false, nullptr)) != cudaSuccess) return e;
  std::vector<double> est(kEstimate);
  for (double& x : est)
    if ((e = once(false, &x)) != cudaSuccess) return e;
  const double t = std::max(median(est), 1e-3);
  // A pathologically slow case (> 50 ms a decode) gets 3 runs, the rest ~kTargetMs.
  const int reps = t > 50.0 ? 3 : std::clamp(static_cast<int>(ceil(kTargetMs / t)), kMinReps, kMaxReps);
  for (int r = 0; r < reps; ++r)
    if ((e = once(true, nullptr)) != cudaSuccess) return e;
  out->med.clear();
  for (auto& s : spans) out->med.push_back(median(s));
  out->reps = reps;
  return cudaSuccess;
}

// Device-to-device copy bandwidth, read + write bytes per second (GB/s); 0 when
// it could not be measured.
double measure_copy_bandwidth() {
  for (size_t bytes : {size_t{4} << 30, size_t{1} << 30}) {
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (a) cudaFree(a);
      if (b) cudaFree(b);
      note("copy bandwidth: could not allocate 2 x %.1f GB", bytes / 1e9);
      continue;
    }
    cudaError_t e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess) e = cudaMemset(b, 0, bytes);
    std::vector<double> t;
    for (int i = 0; i < 12 && e == cudaSuccess; ++i) {
      float ms = 0.f;
      e = cudaEventRecord(g_ev[0]);
      if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
      if (e == cudaSuccess) e = cudaEventRecord(g_ev[1]);
      if (e == cudaSuccess) e = cudaEventSynchronize(g_ev[1]);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, g_ev[0], g_ev[1]);
      if (i >= 2) t.push_back(ms);  // 2 warm-up copies
    }
    cudaFree(a);
    cudaFree(b);
    if (e != cudaSuccess) {
      const std::string msg = cudaGetErrorString(e);
      if (!context_ok()) fatal("copy bandwidth: " + msg);
      emit_line(Json().str("rec", "error").str("src", "ours").str("method", "copy_bw").str("error", msg).done());
      continue;
    }
    const double ms = median(t), gbps = 2.0 * bytes / (ms * 1e6);
    emit_line(Json().str("rec", "copy_bw").str("src", "ours").integer("bytes", bytes).num("ms", ms)
                  .num("gbps", gbps).str("what", "cudaMemcpy device to device, (read + write) bytes / time").done());
    note("copy bandwidth: %.0f GB/s (read + write; %.1f GB copied in %.3f ms, median of 10)", gbps, bytes / 1e9, ms);
    return gbps;
  }
  return 0.0;
}

// ---- one (shape, context, batch) case ---------------------------------------------

struct Method {
  const char* name;
  Proxy proxy;
  Sampling sampling;
  float h;
  uint32_t sparsity;  // 0: dense
  GroupProposal group = GroupProposal::kOff;  // group selection (docs/GROUP_SELECTION.md)
};

struct Case {
  const ModelShape* ms;
  uint32_t n, batch;
  Json base(const char* src = "ours") const {
    Json j;
    j.str("src", src).str("config", ms->name).str("dtype", ms->dtype_name).integer("nq", ms->nq)
        .integer("nkv", ms->nkv).integer("d", ms->d).integer("n", n).integer("batch", batch);
    return j;
  }
};

void case_error(const Case& c, const char* method, uint32_t sparsity, const std::string& msg) {
  Json j = c.base();
  j.str("rec", "error").str("method", method).integer("sparsity", sparsity).str("error", msg);
  emit_line(j.done());
  note("ERROR %s n=%u batch=%u %s %ux: %s", c.ms->name, c.n, c.batch, method, sparsity, msg.c_str());
}

// The launch set of one method over all sessions of the case (budget k per q head).
DecodeBatch make_batch(const Case& c, const std::vector<Session>& sess, const Method& m, uint32_t k) {
  const ModelShape& s = *c.ms;
  const bool sparse = m.proxy != Proxy::kNone;
  const uint32_t n = c.n;
  DecodeBatch b{};
  b.shape = DecodeShape{s.nq, s.nkv, s.d, kPage, kPageShift, g_pq_m, g_pq_k, s.dtype};
  b.shape.pq_code_bits = g_code_bits;
  b.n_items = c.batch;
  b.proxy = m.proxy;
  b.sampling = m.sampling;
  b.group = sparse ? m.group : GroupProposal::kOff;
  b.seed = 1;
  // With group selection a KV head's selection takes its G heads' k' (same
  // budget k per q head; the bench's budgets stay below the candidates).
  const uint32_t share = b.grouped() ? b.shape.group() : 1;
  for (uint32_t i = 0; i < c.batch; ++i) {
    DecodeItem& it = b.items[i];
    it.kv_pages = sess[i].kv_table;
    it.code_pages = sess[i].code_table;
    it.codebooks = sess[i].books;
    it.query_transform = sess[i].query_transform;
    it.q = sess[i].q;
    it.out = sess[i].out;
    it.n_tokens = n;
    it.sink_end = sparse ? kSink : n;
    it.local_begin = sparse ? n - kLocal : n;
    it.n_select = sparse ? std::min((k - kSink - kLocal) * share, n - kSink - kLocal - 1) : 0;
    it.n_heavy = sparse ? static_cast<uint32_t>(m.h * it.n_select + 0.5f) : 0;
  }
  b.n_splits = m.sparsity != 0 ? g_sparse_splits : g_dense_splits;
  b.overlap_launches = g_overlap;
  return b;
}

// The query of batch item `item` in input set `input_set` (the same for every
// method of a case, so that the methods decode the same queries).
uint64_t query_seed(int input_set, uint32_t item) { return 1000003ull * (input_set + 1) + item; }

// Runs (or reports the failure of) one method over all sessions of the case.
void run_method(const Case& c, const std::vector<Session>& sess, const Method& m, int sms, int n_seeds,
                double copy_gbps) {
  const ModelShape& s = *c.ms;
  const bool sparse = m.proxy != Proxy::kNone;
  const uint32_t n = c.n;
  const uint32_t k = sparse ? (n + m.sparsity - 1) / m.sparsity : n;
  if (sparse && k <= kSink + kLocal + 1) {
    case_error(c, m.name, m.sparsity, "budget k too small for sink + local");
    return;
  }
  DecodeBatch b = make_batch(c, sess, m, k);
  if (const char* why = unsupported_shape(b.shape, sparse)) {
    case_error(c, m.name, m.sparsity, std::string("unsupported shape: ") + why);
    return;
  }
  WorkspacePlan plan;
  cudaError_t e = plan_workspace(&b, sms, &plan);
  if (e != cudaSuccess) {
    case_error(c, m.name, m.sparsity, std::string("plan_workspace: ") + cudaGetErrorString(e));
    return;
  }
  Arena wa;
  void* blob = wa.get(plan.total_bytes, "workspace");
  if (!blob) {
    case_error(c, m.name, m.sparsity, wa.error);
    return;
  }
  const Workspace ws = bind_workspace(blob, plan);
  uint64_t step = 0;
  if (g_profile) {
    // The query of the first input set, as the timed runs use.
    for (uint32_t i = 0; i < c.batch && e == cudaSuccess; ++i)
      e = fill(s.dtype, sess[i].q, size_t{s.nq} * s.d, query_seed(0, i));
    if (e == cudaSuccess) e = run_decode(b, plan, ws, nullptr);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      const std::string msg = cudaGetErrorString(e);
      if (!context_ok()) fatal(msg);
      case_error(c, m.name, m.sparsity, msg);
    }
    return;
  }
  // The whole decode, as the library runs it.
  auto total_fn = [&](cudaEvent_t* ev) -> cudaError_t {
    b.step = step++;
    cudaError_t r = cudaEventRecord(ev[0]);
    if (r == cudaSuccess) r = run_decode(b, plan, ws, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[1]);
    return r;
  };
  // The same launches as run_decode (fixed heavy rule, PQ proxy), events between stages.
  auto stage_fn = [&](cudaEvent_t* ev) -> cudaError_t {
    b.step = step++;
    cudaError_t r = cudaEventRecord(ev[0]);
    if (r == cudaSuccess) r = launch_init_rows(b, plan, ws, nullptr);
    if (r == cudaSuccess)
      r = b.group == GroupProposal::kMixture ? launch_group_mixture(b, plan, ws, nullptr)
                                             : launch_pq_scores(b, plan, ws, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[1]);
    if (r == cudaSuccess) r = launch_topk(b, plan, ws, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[2]);
    if (r == cudaSuccess) r = launch_sampling(b, plan, ws, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[3]);
    if (r == cudaSuccess) r = launch_compact(b, plan, ws, b.sampling != Sampling::kNone, 0, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[4]);
    if (r == cudaSuccess) r = launch_split_attention(b, plan, ws, false, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[5]);
    if (r == cudaSuccess) r = launch_merge_splits(b, plan, ws, nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[6]);
    return r;
  };
  std::vector<double> total_seeds, reps, graph_seeds;
  std::array<std::vector<double>, kStages> stage_seeds;
  for (int seed = 0; seed < n_seeds; ++seed) {
    for (uint32_t i = 0; i < c.batch && e == cudaSuccess; ++i)
      e = fill(s.dtype, sess[i].q, size_t{s.nq} * s.d, query_seed(seed, i));
    b.seed = 1 + seed;
    Timing t;
    if (e == cudaSuccess) e = measure(total_fn, 2, &t);
    if (e != cudaSuccess) break;
    total_seeds.push_back(t.med[0]);
    reps.push_back(t.reps);
    // The same decode replayed from a CUDA graph (one launch instead of one per
    // kernel): what the kernels take without host launch gaps.
    {
      cudaStream_t cs = nullptr;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      e = cudaStreamCreate(&cs);  // blocking: ordered with the default stream
      if (e == cudaSuccess) e = cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal);
      if (e == cudaSuccess) {
        const cudaError_t run = run_decode(b, plan, ws, cs);
        e = cudaStreamEndCapture(cs, &graph);
        if (run != cudaSuccess) e = run;
      }
      if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
      auto graph_fn = [&](cudaEvent_t* ev) -> cudaError_t {
        cudaError_t r = cudaEventRecord(ev[0]);
        if (r == cudaSuccess) r = cudaGraphLaunch(exec, cs);
        if (r == cudaSuccess) r = cudaEventRecord(ev[1]);
        return r;
      };
      if (e == cudaSuccess) e = measure(graph_fn, 2, &t);
      if (e == cudaSuccess) graph_seeds.push_back(t.med[0]);
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      if (cs) cudaStreamDestroy(cs);
      if (e != cudaSuccess) break;
    }
    if (sparse) {
      if ((e = measure(stage_fn, kStages + 1, &t)) != cudaSuccess) break;
      for (int i = 0; i < kStages; ++i) stage_seeds[i].push_back(t.med[i]);
    }
  }
  if (e != cudaSuccess) {
    const std::string msg = cudaGetErrorString(e);
    if (!context_ok()) fatal(std::string(s.name) + " n=" + std::to_string(n) + " " + m.name + ": " + msg);
    case_error(c, m.name, m.sparsity, msg);
    return;
  }
  // Bytes: dense reads all K and V once; sparse reads the PQ codes of every token
  // once per KV head plus k rows of K and V per q head (k distinct rows per head).
  // Score traffic (sparse): each token's proxy score per q head, 4 bytes written
  // by scoring and read back by the top-k, at the least. The byte floor counts
  // both; GB/s counts the bytes read from the session's store only.
  const double elem = 2.0;
  const double bytes = c.batch * (sparse ? double(n) * s.nkv * code_bytes() + double(k) * s.nq * s.d * elem * 2
                                         : double(n) * s.nkv * s.d * elem * 2);
  // Rows of scores: one per q head; per KV head with the mean query; the
  // mixture's per-q-head scratch rows plus its KV-head rows.
  const double score_rows = m.group == GroupProposal::kMeanQuery ? s.nkv
                            : m.group == GroupProposal::kMixture ? s.nq + s.nkv
                                                                 : s.nq;
  const double score_bytes = sparse ? c.batch * double(n) * score_rows * 4.0 * 2 : 0.0;
  const double ms = median(total_seeds);
  Json j = c.base();
  j.str("rec", "result").str("method", m.name).integer("sparsity", m.sparsity).integer("k", k);
  if (m.sampling != Sampling::kNone) j.num("h", m.h);
  j.num("ms", ms).nums("ms_seeds", total_seeds).nums("reps", reps)
      .integer("bytes", static_cast<unsigned long long>(llround(bytes)))
      .integer("score_bytes", static_cast<unsigned long long>(llround(score_bytes)))
      .num("gbps", bytes / (ms * 1e6)).integer("splits", plan.n_splits)
      .num("ms_graph", median(graph_seeds));
  if (copy_gbps > 0) j.num("floor_ms", (bytes + score_bytes) / (copy_gbps * 1e6));
  char stages[240] = "";
  if (sparse) {
    const double sc = median(stage_seeds[0]), tk = median(stage_seeds[1]), sa = median(stage_seeds[2]),
                 li = median(stage_seeds[3]), at = median(stage_seeds[4]), mg = median(stage_seeds[5]);
    Json st;
    st.num("score", sc).num("topk", tk).num("sample", sa).num("lists", li).num("attn", at).num("merge", mg);
    j.raw("stages", st.done());
    // The score stage per token per KV head (its lookup tables included): what a
    // proxy's scoring costs, comparable across proxies of equal bytes.
    const double score_ns = sc * 1e6 / (double(c.batch) * n * s.nkv);
    j.num("score_ns_per_token_head", score_ns);
    snprintf(stages, sizeof stages,
             " | score %.3f (%.4f ns/token/KV head) top-k %.3f sample %.3f lists %.3f attn %.3f merge %.3f", sc,
             score_ns, tk, sa, li, at, mg);
  }
  emit_line(j.done());
  note("%s n=%u batch=%u %s %ux: %.3f ms, graph %.3f ms (%.0f GB/s, %u splits)%s", s.name, n, c.batch, m.name,
       m.sparsity, ms, median(graph_seeds), bytes / (ms * 1e6), plan.n_splits, stages);
}

#ifdef SSA_WITH_FLASHINFER
// FlashInfer's batch decode (bench/flashinfer_decode.h) over the same pages and the
// same queries as ours, timed the same way. Its output for the first input set is
// compared with our dense decode's: both are exact attention, so they must agree
// to f16/bf16 rounding, which also checks that FlashInfer reads the pages right.
void run_flashinfer(const Case& c, const std::vector<Session>& sess, const uint8_t* kv_pool, int sms,
                    int n_seeds, double copy_gbps) {
  const ModelShape& s = *c.ms;
  const char* name = "flashinfer";
  const size_t qn = size_t{s.nq} * s.d;  // elements per item
  Arena a;
  uint8_t* q = static_cast<uint8_t*>(a.get(c.batch * qn * 2, "FlashInfer q"));
  uint8_t* out = static_cast<uint8_t*>(a.get(c.batch * qn * 2, "FlashInfer out"));
  if (!a.error.empty()) {
    case_error(c, name, 0, a.error);
    return;
  }
  const ssa_bench::FlashInferArgs args{s.nq, s.nkv, s.d, kPage, c.batch, c.n, s.dtype == DType::kBF16,
                                       kv_pool, q, out};
  std::string why;
  auto fi = ssa_bench::FlashInferDecode::create(args, &why);
  if (!fi) {
    if (!context_ok()) fatal(std::string(s.name) + " flashinfer: " + why);
    case_error(c, name, 0, why);
    return;
  }
  auto fn = [&](cudaEvent_t* ev) -> cudaError_t {
    cudaError_t r = cudaEventRecord(ev[0]);
    if (r == cudaSuccess) r = fi->run(nullptr);
    if (r == cudaSuccess) r = cudaEventRecord(ev[1]);
    return r;
  };
  std::vector<double> seeds_ms, reps;
  double max_diff = 0.0, max_ref = 0.0;
  cudaError_t e = cudaSuccess;
  for (int seed = 0; seed < n_seeds && e == cudaSuccess; ++seed) {
    for (uint32_t i = 0; i < c.batch && e == cudaSuccess; ++i) {
      e = fill(s.dtype, q + i * qn * 2, qn, query_seed(seed, i));
      if (e == cudaSuccess && seed == 0) e = fill(s.dtype, sess[i].q, qn, query_seed(seed, i));
    }
    Timing t;
    if (e == cudaSuccess) e = measure(fn, 2, &t);
    if (e != cudaSuccess) break;
    seeds_ms.push_back(t.med[0]);
    reps.push_back(t.reps);
    if (seed != 0) continue;
    // Our dense decode of the same queries, for the comparison.
    const Method dense{"dense", Proxy::kNone, Sampling::kNone, 0.f, 0};
    DecodeBatch b = make_batch(c, sess, dense, c.n);
    WorkspacePlan plan;
    if ((e = plan_workspace(&b, sms, &plan)) != cudaSuccess) break;
    Arena wa;
    void* blob = wa.get(plan.total_bytes, "workspace");
    if (!blob) {
      case_error(c, name, 0, wa.error);
      return;
    }
    if ((e = run_decode(b, plan, bind_workspace(blob, plan), nullptr)) != cudaSuccess) break;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) break;
    std::vector<uint8_t> got(c.batch * qn * 2), ref(qn * 2);
    if ((e = cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost)) != cudaSuccess) break;
    for (uint32_t i = 0; i < c.batch && e == cudaSuccess; ++i) {
      if ((e = cudaMemcpy(ref.data(), sess[i].out, ref.size(), cudaMemcpyDeviceToHost)) != cudaSuccess) break;
      for (size_t j = 0; j < qn; ++j) {
        const float r = load_as_f32(ref.data(), s.dtype, j), g = load_as_f32(got.data(), s.dtype, i * qn + j);
        max_ref = std::max(max_ref, double(fabsf(r)));
        max_diff = std::max(max_diff, double(fabsf(r - g)));
      }
    }
  }
  if (e != cudaSuccess) {
    const std::string msg = cudaGetErrorString(e);
    if (!context_ok()) fatal(std::string(s.name) + " n=" + std::to_string(c.n) + " flashinfer: " + msg);
    case_error(c, name, 0, msg);
    return;
  }
  // f16/bf16 outputs of two exact attentions: a few units in the last place.
  if (!(max_diff <= 2e-2 * max_ref + 1e-3)) {
    char buf[160];
    snprintf(buf, sizeof buf, "output differs from our dense decode: max abs diff %.3g (max |out| %.3g)",
             max_diff, max_ref);
    case_error(c, name, 0, buf);
    return;
  }
  const double bytes = c.batch * double(c.n) * s.nkv * s.d * 2.0 * 2;
  const double ms = median(seeds_ms);
  Json j = c.base("flashinfer");
  j.str("rec", "result").str("method", name).integer("sparsity", 0).integer("k", c.n);
  j.num("ms", ms).nums("ms_seeds", seeds_ms).nums("reps", reps)
      .integer("bytes", static_cast<unsigned long long>(llround(bytes))).num("gbps", bytes / (ms * 1e6))
      .num("max_abs_diff_vs_dense", max_diff).num("max_abs_dense", max_ref);
  if (copy_gbps > 0) j.num("floor_ms", bytes / (copy_gbps * 1e6));
  emit_line(j.done());
  note("%s n=%u batch=%u flashinfer: %.3f ms (%.0f GB/s; max abs diff vs our dense %.2g)", s.name, c.n,
       c.batch, ms, bytes / (ms * 1e6), max_diff);
}
#endif

void run_case(const Case& c, const std::vector<uint32_t>& sparsities, int sms, int n_seeds, double copy_gbps) {
  const ModelShape& s = *c.ms;
  const uint32_t n = c.n, B = c.batch;
  if (B > kMaxBatchItems) {
    // One launch set holds at most kMaxBatchItems items.
    case_error(c, "*", 0, "batch exceeds kMaxBatchItems = " + std::to_string(kMaxBatchItems));
    return;
  }
  if (elapsed_s() > g_budget_s) {
    case_error(c, "*", 0, "skipped: time budget of " + std::to_string(int(g_budget_s)) + " s spent");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t pages = (n + kPage - 1) / kPage;
  const size_t kv_page = size_t{2} * kPage * s.nkv * s.d * 2, code_page = size_t{s.nkv} * code_bytes() * kPage;
  const uint32_t sub = s.d / g_pq_m;
  size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  note("case %s n=%u batch=%u: %.2f GB of K/V + %.2f GB of codes (device free %.2f of %.2f GB)", s.name, n, B,
       double(B) * kv_page * pages / 1e9, double(B) * code_page * pages / 1e9, fr / 1e9, tot / 1e9);
  Arena arena;
  std::vector<Session> sess(B);
  PqIndexShape is{s.nkv, s.d, g_pq_m, g_pq_k, kPage, kPageShift, s.dtype};
  is.code_bits = g_code_bits;
  is.key_transform = g_transform;
  const DeviceBooksLayout bl = device_books_layout(is);
  cudaError_t e = cudaSuccess;
  // All sessions' K/V pages in one pool (a page-table baseline such as FlashInfer
  // indexes pages from one base).
  uint8_t* kv_pool = static_cast<uint8_t*>(arena.get(kv_page * pages * B, "K/V pages"));
  for (uint32_t i = 0; i < B && arena.error.empty() && e == cudaSuccess; ++i) {
    Session& ss = sess[i];
    ss.kv = kv_pool + kv_page * pages * i;
    ss.codes = static_cast<uint8_t*>(arena.get(code_page * pages, "code pages"));
    ss.kv_table = static_cast<const uint8_t**>(arena.get(size_t{pages} * 8, "page table"));
    ss.code_table = static_cast<uint8_t**>(arena.get(size_t{pages} * 8, "code page table"));
    ss.books = static_cast<float*>(arena.get(bl.floats() * 4, "codebooks"));
    ss.query_transform = g_transform ? ss.books + bl.query_transform_offset() : nullptr;
    ss.q = arena.get(size_t{s.nq} * s.d * 2, "q");
    ss.out = arena.get(size_t{s.nq} * s.d * 2, "out");
    if (!arena.error.empty()) break;
    std::vector<const uint8_t*> kt(pages);
    std::vector<uint8_t*> ct(pages);
    for (uint32_t p = 0; p < pages; ++p) kt[p] = ss.kv + kv_page * p, ct[p] = ss.codes + code_page * p;
    e = cudaMemcpy(ss.kv_table, kt.data(), size_t{pages} * 8, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(ss.code_table, ct.data(), size_t{pages} * 8, cudaMemcpyHostToDevice);
    // A different K/V stream per session, per shape and per context.
    const uint64_t seed = (uint64_t{n} << 20) ^ (uint64_t(&s - kShapes) << 16) ^ (uint64_t{B} << 8) ^ i;
    if (e == cudaSuccess) e = fill(s.dtype, ss.kv, kv_page * pages / 2, seed);
    if (e == cudaSuccess) {
      if (s.dtype == DType::kF16) {
        fill_books<<<dim3(g_pq_k, g_pq_m, s.nkv), 32>>>(reinterpret_cast<const __half*>(ss.kv), ss.books, g_pq_m,
                                                         g_pq_k, sub, s.d);
      } else {
        fill_books<<<dim3(g_pq_k, g_pq_m, s.nkv), 32>>>(reinterpret_cast<const __nv_bfloat16*>(ss.kv), ss.books,
                                                         g_pq_m, g_pq_k, sub, s.d);
      }
      e = cudaGetLastError();
    }
    if (e == cudaSuccess && g_transform) {
      // T and the query's matrix: one signed permutation (orthogonal, its own
      // inverse transpose). Scoring and encoding cost what any dense d x d costs.
      fill_transform<<<dim3(s.d, s.nkv, 2), 128>>>(ss.books + bl.key_transform_offset(), s.d);
      e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = pq_encode(is, ss.kv_table, ss.code_table, ss.books, 0, n, nullptr);
    if (e == cudaSuccess) e = fill(s.dtype, ss.out, size_t{s.nq} * s.d, 1);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (!arena.error.empty()) {
    case_error(c, "*", 0, arena.error);
    return;
  }
  if (e != cudaSuccess) {
    const std::string msg = std::string("setup: ") + cudaGetErrorString(e);
    if (!context_ok()) fatal(msg);
    case_error(c, "*", 0, msg);
    return;
  }
  note("setup (fill, codebooks, PQ encoding of %u sessions) %.2f s", B,
       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::vector<Method> methods = {{"dense", Proxy::kNone, Sampling::kNone, 0.f, 0}};
  for (uint32_t sp : sparsities) {
    methods.push_back({"pq_topk", Proxy::kPq, Sampling::kNone, 1.f, sp});
    methods.push_back({"ssa", Proxy::kPq, Sampling::kProxy, kSsaH, sp});
    methods.push_back({"pq_topk_gmean", Proxy::kPq, Sampling::kNone, 1.f, sp, GroupProposal::kMeanQuery});
    methods.push_back({"ssa_gmean", Proxy::kPq, Sampling::kProxy, kSsaH, sp, GroupProposal::kMeanQuery});
    methods.push_back({"ssa_gmix", Proxy::kPq, Sampling::kProxy, kSsaH, sp, GroupProposal::kMixture});
  }
  for (const Method& m : methods) {
    if (!method_on(m.name)) continue;
    if (g_profile && m.sparsity != 0 && m.sparsity != 50) continue;
    if (elapsed_s() > g_budget_s) {
      case_error(c, m.name, m.sparsity, "skipped: time budget spent");
      continue;
    }
    run_method(c, sess, m, sms, n_seeds, copy_gbps);
  }
#ifdef SSA_WITH_FLASHINFER
  if (!g_profile && method_on("flashinfer")) {
    if (elapsed_s() > g_budget_s) case_error(c, "flashinfer", 0, "skipped: time budget spent");
    else run_flashinfer(c, sess, kv_pool, sms, n_seeds, copy_gbps);
  }
#endif
}

// ---- arguments ------------------------------------------------------------------

// A comma-separated list of names ("a,b"; an empty name stays in the list).
std::vector<std::string> split_names(const char* s) {
  std::vector<std::string> out;
  const std::string list = s;
  for (size_t p = 0; p <= list.size();) {
    const size_t q = std::min(list.find(',', p), list.size());
    out.push_back(list.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

// Comma-separated unsigned integers, each with an optional K (x1024) or M (x1048576).
bool parse_list(const char* s, std::vector<uint32_t>* out) {
  out->clear();
  while (*s) {
    char* end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return false;
    if (*end == 'K' || *end == 'k') v <<= 10, ++end;
    else if (*end == 'M' || *end == 'm') v <<= 20, ++end;
    if (v == 0 || v > 0xffffffffull) return false;
    out->push_back(static_cast<uint32_t>(v));
    if (*end == ',') ++end;
    else if (*end) return false;
    s = end;
  }
  return !out->empty();
}

void usage() {
  fprintf(stderr,
          "usage: gpu_decode_bench [--out FILE] [--configs paper,llama8b] [--contexts 128K,512K,1M]\n"
          "         [--batches 1,16] [--sparsity 10,20,50,100] [--seeds 3] [--time-budget-s 270]\n"
          "         [--sparse-splits N] [--dense-splits N] [--overlap-launches 0|1] [--pq-m 16|8|32|64]\n"
          "         [--proxy pq|pq4|opq|opq4|qpq|qpq4]  (4-bit: 32 subspaces unless --pq-m)\n"
          "         [--methods dense,pq_topk,ssa,pq_topk_gmean,ssa_gmean,ssa_gmix,flashinfer]\n");
}

}  // namespace

int main(int argc, char** argv) {
  g_start = std::chrono::steady_clock::now();
  g_profile = getenv("SSA_BENCH_PROFILE") != nullptr;
  std::vector<uint32_t> contexts = {131072u, 524288u, 1048576u}, batches = {1u, 16u},
                        sparsities = {10u, 20u, 50u, 100u};
  std::vector<const ModelShape*> shapes = {&kShapes[0], &kShapes[1]};
  int n_seeds = 3;
  bool contexts_given = false, batches_given = false, pq_m_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    if (a == "--out" && ok) {
      g_out = fopen(v, "w");
      if (!g_out) {
        fprintf(stderr, "cannot write %s\n", v);
        return 2;
      }
    } else if (a == "--contexts" && ok) {
      contexts_given = true;
      ok = parse_list(v, &contexts);
    } else if (a == "--batches" && ok) {
      batches_given = true;
      ok = parse_list(v, &batches);
    } else if (a == "--sparsity" && ok) {
      ok = parse_list(v, &sparsities);
    } else if (a == "--seeds" && ok) {
      n_seeds = atoi(v);
      ok = n_seeds >= 1 && n_seeds <= 9;
    } else if (a == "--methods" && ok) {
      g_methods = split_names(v);
      for (const std::string& m : g_methods) {
        ok = ok && (m == "dense" || m == "pq_topk" || m == "ssa" || m == "pq_topk_gmean" || m == "ssa_gmean" ||
                    m == "ssa_gmix" || m == "flashinfer");
#ifndef SSA_WITH_FLASHINFER
        if (m == "flashinfer") {
          fprintf(stderr, "flashinfer: built without -DSSA_FLASHINFER_DIR\n");
          return 2;
        }
#endif
      }
    } else if (a == "--sparse-splits" && ok) {
      g_sparse_splits = static_cast<uint32_t>(atoi(v));
      ok = g_sparse_splits <= kMaxSplits;
    } else if (a == "--dense-splits" && ok) {
      g_dense_splits = static_cast<uint32_t>(atoi(v));
      ok = g_dense_splits <= kMaxSplits;
    } else if (a == "--pq-m" && ok) {
      g_pq_m = static_cast<uint32_t>(atoi(v));
      pq_m_given = true;
      ok = g_pq_m == 8 || g_pq_m == 16 || g_pq_m == 32 || g_pq_m == 64;
    } else if (a == "--proxy" && ok) {
      g_proxy = v;
      ok = g_proxy == "pq" || g_proxy == "pq4" || g_proxy == "opq" || g_proxy == "opq4" || g_proxy == "qpq" ||
           g_proxy == "qpq4";
      g_code_bits = g_proxy.back() == '4' ? 4 : 8;
      g_pq_k = g_code_bits == 4 ? 16 : 256;
      g_transform = g_proxy[0] != 'p';
    } else if (a == "--overlap-launches" && ok) {
      g_overlap = atoi(v) != 0;
    } else if (a == "--time-budget-s" && ok) {
      g_budget_s = atof(v);
      ok = g_budget_s > 0;
    } else if (a == "--configs" && ok) {
      shapes.clear();
      for (const std::string& name : split_names(v)) {
        const ModelShape* found = nullptr;
        for (const ModelShape& ms : kShapes)
          if (name == ms.name) found = &ms;
        ok = ok && found != nullptr;
        if (found) shapes.push_back(found);
      }
    } else {
      ok = false;
    }
    if (!ok) {
      fprintf(stderr, "bad argument: %s %s\n", a.c_str(), v ? v : "");
      usage();
      return 2;
    }
    ++i;
  }
  if (g_code_bits == 4 && !pq_m_given) g_pq_m = 32;  // PQ's 16 bytes per token per KV head
  if (g_code_bits == 4 && g_pq_m < 32) {
    fprintf(stderr, "--proxy %s: 4-bit codes at --pq-m %u would cost fewer bytes than PQ's; use 32 or 64\n",
            g_proxy.c_str(), g_pq_m);
    return 2;
  }
  if (g_profile) {
    shapes = {shapes.empty() ? &kShapes[0] : shapes[0]};
    contexts = {contexts_given ? contexts[0] : 1048576u};
    batches = {batches_given ? batches[0] : 1u};
    sparsities = {50u};
  }

  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) fatal(std::string("no CUDA device: ") + cudaGetErrorString(e));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  for (cudaEvent_t& ev : g_ev)
    if ((e = cudaEventCreate(&ev)) != cudaSuccess) fatal(cudaGetErrorString(e));
  void* flush = nullptr;
  if ((e = cudaMalloc(&flush, kFlushBytes)) != cudaSuccess) fatal(cudaGetErrorString(e));
  if ((e = cudaMemset(flush, 1, kFlushBytes)) != cudaSuccess) fatal(cudaGetErrorString(e));
  if ((e = cudaMalloc(&g_sink, 64)) != cudaSuccess) fatal(cudaGetErrorString(e));
  g_flush = static_cast<const uint4*>(flush);
  emit_line(Json().str("rec", "meta").str("src", "ours").str("device", prop.name)
                .integer("sms", prop.multiProcessorCount).num("l2_mb", prop.l2CacheSize / 1048576.0)
                .num("mem_gb", prop.totalGlobalMem / 1e9).integer("driver", driver).integer("runtime", runtime)
                .integer("max_batch_items", kMaxBatchItems).integer("seeds", n_seeds).num("target_ms", kTargetMs)
                .integer("page_tokens", kPage).integer("pq_m", g_pq_m).integer("pq_k", g_pq_k).str("proxy", g_proxy.c_str()).integer("sink", kSink)
                .integer("local", kLocal).num("flush_mb", kFlushBytes / 1048576.0)
                .integer("overlap_launches", g_overlap ? 1 : 0).done());
#ifdef SSA_WITH_FLASHINFER
  emit_line(Json().str("rec", "meta").str("src", "flashinfer").str("version", SSA_FLASHINFER_VERSION).done());
#endif
  const double copy_gbps = g_profile ? 0.0 : measure_copy_bandwidth();
  for (const ModelShape* ms : shapes)
    for (uint32_t n : contexts)
      for (uint32_t B : batches) run_case(Case{ms, (n + kPage - 1) / kPage * kPage, B}, sparsities,
                                          prop.multiProcessorCount, n_seeds, copy_gbps);
  note("done in %.1f s", elapsed_s());
  if (g_out) fclose(g_out);
  return 0;
}
