// k-means++ seeding of the PQ codebooks on the GPU: one block per (subspace, KV
// head) codebook picks its K seeds one after another from the codebook's evenly
// spread subset of the sample, with the CPU's draws (lib/index/kmeans_rng.h) and
// the CPU's arithmetic (lib/index/kmeans_pp_rule.h): D^2 weights are integers, so
// the block's scan of them gives the running sums the CPU's sequential loop
// does, and both pick the same seeds. Weighted training (the query-aware
// proxies' key weights) draws with probability ~ w D^2, the float product the
// CPU takes.
#include "device_util.cuh"
#include "index/kmeans_pp_rule.h"
#include "index/kmeans_rng.h"
#include "kmeans_workspace.cuh"
#include "pq_index.h"

namespace ssa::cuda {
namespace {

constexpr uint32_t kSeedThreads = 1024;
constexpr uint32_t kWarps = kSeedThreads / 32;
// Points per thread: the subset's points split into contiguous runs, one per thread.
constexpr uint32_t kMaxRun = (kKmeansPpMaxPoints + kSeedThreads - 1) / kSeedThreads;
constexpr uint32_t kMaxSub = 64;

__device__ uint64_t warp_inclusive_scan(uint64_t v, uint32_t lane) {
  for (uint32_t o = 1; o < 32; o <<= 1) {
    const uint64_t u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// weights: [n_kv][n], or null (every point weighs 1).
__global__ void __launch_bounds__(kSeedThreads) seed_kernel(PqIndexShape s, const float* x, const float* weights,
                                                            uint32_t n, float* subset_all, float* books) {
  __shared__ float cen[kMaxSub];
  __shared__ uint64_t warp_sum[kWarps];
  __shared__ float warp_max[kWarps];
  __shared__ uint64_t total_s;
  __shared__ uint32_t pick_s;
  const uint32_t hm = blockIdx.x, h = hm / s.subspaces, m = hm % s.subspaces;
  const uint32_t sub = s.head_dim / s.subspaces, K = s.centroids, tid = threadIdx.x;
  const uint32_t lane = tid & 31, warp = tid >> 5;
  float* book = books + size_t{hm} * K * sub;
  auto sample = [&](uint64_t i) { return x + (size_t{h} * n + i) * s.head_dim + m * sub; };

  if (n <= K) {  // every point its own centroid, the rest repeat the last point (as the CPU)
    for (uint32_t e = tid; e < K * sub; e += kSeedThreads) {
      const uint32_t c = e / sub;
      book[e] = sample(c < n ? c : n - 1)[e % sub];
    }
    return;
  }
  const uint32_t ns = kmeans_pp_subset_size(n);
  float* pts = subset_all + size_t{hm} * ns * sub;
  for (uint32_t e = tid; e < ns * sub; e += kSeedThreads)
    pts[e] = sample(kmeans_pp_subset_point(e / sub, n))[e % sub];
  const RngStream rng = kmeans_stream(codebook_seed(h, m, s.subspaces));
  uint32_t draws = 0;
  auto next_uniform = [&]() { return rng_uniform(rng_draw(rng, draws++).v[0]); };
  if (tid == 0) {
    uint32_t first = static_cast<uint32_t>(next_uniform() * static_cast<double>(ns));
    pick_s = first >= ns ? ns - 1 : first;
  } else {
    ++draws;  // every thread keeps the same count of draws
  }
  __syncthreads();  // the subset is written, the first pick made

  // This thread's run of points [r0, r1) and their weights.
  const uint32_t run = (ns + kSeedThreads - 1) / kSeedThreads;
  const uint32_t r0 = min(ns, tid * run), r1 = min(ns, r0 + run);
  float d2[kMaxRun], wt[kMaxRun];
#pragma unroll
  for (uint32_t r = 0; r < kMaxRun; ++r)
    wt[r] = weights != nullptr && r0 + r < r1 ? weights[size_t{h} * n + kmeans_pp_subset_point(r0 + r, n)] : 1.0f;
  // A point's draw weight: D^2, times its weight if it has one (kmeans_pp_seed's rule).
  const bool weighted = weights != nullptr;
  auto draw = [weighted](float d, float w) { return weighted ? __fmul_rn(d, w) : d; };
  auto take_pick = [&](uint32_t c) {
    const uint32_t p = pick_s;
    if (tid < sub) {
      cen[tid] = pts[size_t{p} * sub + tid];
      book[size_t{c} * sub + tid] = cen[tid];
    }
  };
  take_pick(0);
  __syncthreads();
  float mx = 0.0f;
#pragma unroll
  for (uint32_t r = 0; r < kMaxRun; ++r) {
    const uint32_t i = r0 + r;
    d2[r] = i < r1 ? kmeans_pp_sq_dist(pts + size_t{i} * sub, cen, sub) : 0.0f;
    mx = fmaxf(mx, draw(d2[r], wt[r]));
  }
  for (uint32_t o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) warp_max[warp] = mx;
  __syncthreads();
  mx = 0.0f;
  for (uint32_t w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_max[w]);
  const double scale = kmeans_pp_scale(mx);

  for (uint32_t c = 1; c < K; ++c) {
    // Running sums of the weights in point order: this thread's, then the block's.
    uint64_t mine = 0;
#pragma unroll
    for (uint32_t r = 0; r < kMaxRun; ++r) mine += r0 + r < r1 ? kmeans_pp_weight(draw(d2[r], wt[r]), scale) : 0;
    const uint64_t incl = warp_inclusive_scan(mine, lane);
    if (lane == 31) warp_sum[warp] = incl;
    const double u = next_uniform();
    __syncthreads();
    if (warp == 0) {
      const uint64_t w = warp_sum[lane];
      const uint64_t wincl = warp_inclusive_scan(w, lane);
      warp_sum[lane] = wincl - w;  // exclusive: the weight of the warps before
      if (lane == 31) {
        total_s = wincl;
        pick_s = wincl > 0 ? ns - 1 : static_cast<uint32_t>(static_cast<uint64_t>(u * static_cast<double>(ns)) % ns);
      }
    }
    __syncthreads();
    const uint64_t total = total_s;
    if (total > 0) {
      const uint64_t target = kmeans_pp_target(u, total);
      uint64_t run_sum = warp_sum[warp] + incl - mine;  // the weight of the points before r0
      if (run_sum <= target && target < run_sum + mine) {  // the pick is one of this thread's points
#pragma unroll
        for (uint32_t r = 0; r < kMaxRun; ++r) {
          if (r0 + r >= r1) break;
          run_sum += kmeans_pp_weight(draw(d2[r], wt[r]), scale);
          if (run_sum > target) {
            pick_s = r0 + r;
            break;
          }
        }
      }
    }
    __syncthreads();
    take_pick(c);
    __syncthreads();
#pragma unroll
    for (uint32_t r = 0; r < kMaxRun; ++r) {
      const uint32_t i = r0 + r;
      if (i < r1) d2[r] = fminf(d2[r], kmeans_pp_sq_dist(pts + size_t{i} * sub, cen, sub));
    }
  }
}

}  // namespace

cudaError_t pq_seed(const PqIndexShape& s, uint32_t n, bool weighted, void* workspace, float* books,
                    cudaStream_t st) {
  if (n == 0 || s.head_dim / s.subspaces > kMaxSub || s.centroids == 0) return cudaErrorInvalidValue;
  const KmeansWorkspace w = kmeans_workspace(s, n, workspace);
  seed_kernel<<<s.n_kv_heads * s.subspaces, kSeedThreads, 0, st>>>(s, w.x, weighted ? w.weights : nullptr, n,
                                                                   w.seed_points, books);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
