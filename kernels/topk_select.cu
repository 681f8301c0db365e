// Top-k of each row's candidate scores, as a bitmap of the selected candidates.
// Passes over the scores, then work only on the candidates near the cut:
//  1. histogram: candidates binned by distance below the row maximum (ScoreBins,
//     device_util.cuh: 1024 bins over at most 32 logits). On long rows with a
//     small k only one candidate per 32 (a hashed position in each 32-candidate
//     block) is counted: a twentieth of the pass's time, most of it reading scores;
//  2. resolve (the histogram's last block of each row): the bins whose candidates
//     go to a short boundary list. With every candidate counted, the one bin
//     holding the k-th largest score (the bins above it are selected outright);
//     from the sample, every bin down to where the sample count exceeds the
//     expected count of the top k by topk_sample_sigmas standard deviations, so
//     the list holds the top k unless the sample was unusually skewed;
//  3. filter: writes the bitmap words of the bins above the list (selected
//     outright), appends the list's candidates and, for the sampling methods with
//     the fixed heavy rule, sums the residual weights of the rest per block and
//     chunk for the sampler (saving it a pass over the scores);
//  4. refine: one block per row radix-selects, over the list only, the exact
//     score bits of the cut (8 bits a pass) and, where equal scores straddle it,
//     the lowest token indices among them; it sets their bits and adds the list
//     candidates it leaves to the residual sums. Should the list hold fewer than
//     needed (a skewed sample), it takes all of them and selects the rest from a
//     full pass over the row: slower, the same result.
// The selected set is exactly the CPU's top-k (ties to the lower index); the
// bitmap does not depend on thread timing or on the sample, and
// kernels/bitmap_compact.cu turns it into a token-ordered list.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>

#include "device_util.cuh"
#include "head_dim.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRefineThreads = 1024;
static_assert(kScoreBins % kThreads == 0, "resolve: whole bins per thread");

struct Row {
  const DecodeItem* it;
  uint32_t h, row, nc;
  const float* cand_scores;  // scores of candidate 0 (token sink_end)
  __device__ bool sparse() const { return it->sink_end < it->local_begin && it->n_select > 0; }
};

__device__ Row row_here(const DecodeBatch& b, const Workspace& ws) {
  Row r;
  r.it = &b.items[blockIdx.z];
  r.h = blockIdx.y;
  r.row = row_of(blockIdx.z, blockIdx.y, b.shape.n_q_heads);
  r.nc = r.it->local_begin - r.it->sink_end;
  r.cand_scores = ws.scores + row_token_base(*r.it, r.h) + r.it->sink_end;
  return r;
}

// Candidate counted by the histogram at sample index u: every candidate, or with
// shift > 0 one at a hashed position inside each block of 2^shift (Fibonacci
// hashing spreads neighbouring blocks' positions).
__device__ __forceinline__ uint32_t sampled_candidate(uint32_t u, uint32_t shift) {
  return shift == 0 ? u : (u << shift) + ((u * 0x9E3779B1u) >> (32 - shift));
}

// The last block of each row to finish its histogram also resolves the boundary
// bins (no separate launch): bin 0 holds the scores nearest the maximum.
__global__ void __launch_bounds__(kThreads) hist_kernel(DecodeBatch b, Workspace ws, uint32_t shift) {
  stage_begin();
  const Row r = row_here(b, ws);
  if (!r.sparse()) return;
  RowState& st = ws.rows[r.row];
  const uint32_t k = st.topk_k;
  if (k == 0) return;
  __shared__ uint32_t hist_s[kScoreBins];
  __shared__ bool last_s;
  for (uint32_t i = threadIdx.x; i < kScoreBins; i += kThreads) hist_s[i] = 0;
  __syncthreads();
  const ScoreBins bins(st);
  const uint32_t n_u = (r.nc + (1u << shift) - 1) >> shift;
  const uint32_t per = (n_u + gridDim.x - 1) / gridDim.x;
  const uint32_t begin = min(n_u, blockIdx.x * per), end = min(n_u, begin + per);
  // Four loads in flight per thread before their four shared-memory updates.
  for (uint32_t u0 = begin + threadIdx.x; u0 < end; u0 += 4 * kThreads) {
    float v[4];
    bool in[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t u = u0 + q * kThreads, j = sampled_candidate(u, shift);
      in[q] = u < end && j < r.nc;
      v[q] = in[q] ? r.cand_scores[j] : 0.f;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (in[q]) atomicAdd(&hist_s[bins.bin(v[q])], 1u);
    }
  }
  __syncthreads();
  uint32_t* hist = ws.hist + size_t{r.row} * kScoreBins;
  for (uint32_t i = threadIdx.x; i < kScoreBins; i += kThreads) {
    if (hist_s[i]) atomicAdd(&hist[i], hist_s[i]);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_s = atomicAdd(&st.hist_blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  if (r.nc <= k) {  // every candidate is selected
    if (threadIdx.x == 0) {
      st.topk_k = r.nc;
      if (b.heavy == HeavyRule::kFixed) st.n_heavy = r.nc;
      st.cut_first = st.cut_last = kScoreBins;
      st.cut_need = 0;
    }
    return;
  }
  // Resolve: kBinsPerThread consecutive bins per thread, one block scan.
  constexpr uint32_t kBinsPerThread = kScoreBins / kThreads;
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  uint32_t c[kBinsPerThread], mine = 0;
#pragma unroll
  for (uint32_t i = 0; i < kBinsPerThread; ++i) {
    c[i] = __ldcg(&hist[threadIdx.x * kBinsPerThread + i]);  // other blocks' atomics: from L2
    mine += c[i];
  }
  uint32_t run;
  Scan(tmp).ExclusiveSum(mine, run);
  if (shift == 0) {  // exact counts: the bin of the k-th largest
#pragma unroll
    for (uint32_t i = 0; i < kBinsPerThread; ++i) {
      if (run < k && k <= run + c[i]) {
        st.cut_first = st.cut_last = threadIdx.x * kBinsPerThread + i;
        st.cut_need = k - run;
      }
      run += c[i];
    }
    return;
  }
  // From the sample: the top k hold k / 2^shift sampled candidates on average.
  // The list runs from bin 0 to the first bin where the sample count reaches
  // `want` (every bin when the sample never does).
  const float expect = static_cast<float>(k) / static_cast<float>(1u << shift);
  const float want = expect + b.topk_sample_sigmas * sqrtf(expect) + 1.f;
  if (threadIdx.x == 0) {
    st.cut_first = 0;
    st.cut_last = want <= 0.f ? 0u : kScoreBins - 1;
    st.cut_need = k;
  }
  __syncthreads();
#pragma unroll
  for (uint32_t i = 0; i < kBinsPerThread; ++i) {
    if (static_cast<float>(run) < want && want <= static_cast<float>(run + c[i]))
      st.cut_last = threadIdx.x * kBinsPerThread + i;
    run += c[i];
  }
}

// One warp per 1024-candidate chunk: the chunk's scores go through shared memory
// so that each lane then owns one 32-candidate block (its bitmap word, its
// boundary-list candidates and, with filter_sums_residual, its residual weight
// sum for the sampler, in the layout stratified_sample.cu reads). The list's
// candidates are left out of the sums here; refine adds those it does not select.
__global__ void __launch_bounds__(kThreads) filter_kernel(DecodeBatch b, Workspace ws) {
  stage_begin();
  constexpr uint32_t kWarps = kThreads / 32;
  __shared__ ChunkTile tile_s[kWarps];
  const Row r = row_here(b, ws);
  if (!r.sparse()) return;
  RowState& st = ws.rows[r.row];
  const uint32_t k = st.topk_k, cut_first = st.cut_first, cut_span = st.cut_last - st.cut_first;
  const bool collect = k > 0 && st.cut_need > 0;
  const bool sums = filter_sums_residual(b), uniform = b.sampling == Sampling::kUniform;
  const ScoreBins bins(st);
  const size_t bbase = row_block_base(*r.it, r.h), cbase = row_chunk_base(*r.it, r.h);
  uint32_t* cut = ws.cut + row_token_base(*r.it, r.h);
  const uint32_t chunks = (r.nc + kChunkTokens - 1) / kChunkTokens;
  const uint32_t per = (chunks + gridDim.x - 1) / gridDim.x;
  const uint32_t c_begin = min(chunks, blockIdx.x * per), c_end = min(chunks, c_begin + per);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  ChunkTile& tile = tile_s[warp];
  double heavy_mass = 0.0, resid_mass = 0.0;  // statistics (RowState::w_heavy, w_resid_proxy)
  for (uint32_t c = c_begin + warp; c < c_end; c += kWarps) {
    const uint32_t j0 = c * kChunkTokens;
    const uint32_t n_here = min(kChunkTokens, r.nc - j0);
    load_chunk_tile(tile, r.cand_scores + j0, n_here, lane);
    const uint32_t n_mine = lane * kBlockTokens < n_here ? min(kBlockTokens, n_here - lane * kBlockTokens) : 0u;
    uint32_t sel = 0, in_cut = 0;
    uint64_t resid = 0;
    float heavy_blk = 0.f, resid_blk = 0.f;  // statistics: float within a block, double across
#pragma unroll 8
    for (uint32_t i = 0; i < kBlockTokens; ++i) {
      const float v = tile[lane][i];
      const uint32_t bin = k > 0 && i < n_mine ? bins.bin(v) : kScoreBins;  // kScoreBins: none
      const bool heavy = bin < cut_first;
      const bool listed = collect && bin - cut_first <= cut_span;  // bin in [cut_first, cut_last]
      sel |= uint32_t{heavy} << i;
      in_cut |= uint32_t{listed} << i;
      if (sums) {
        const CandWeight w = cand_weight(v, bins.mx, uniform);
        if (heavy) {
          heavy_blk += w.e;
        } else if (!listed) {
          resid += w.fixed;
          resid_blk += w.e;
        }
      }
    }
    heavy_mass += heavy_blk;
    resid_mass += resid_blk;
    const uint32_t blk = c * kBlocksPerChunk + lane;
    ws.heavy_bits[bbase + blk] = sel;
    if (sums) {
      ws.bsum[bbase + blk] = resid;
      ws.sample_bits[bbase + blk] = 0u;
      const uint64_t chunk_sum = warp_sum(resid);
      if (lane == 0) ws.csum[cbase + c] = chunk_sum;
    }
    // The boundary candidates: one slot reservation per warp, lanes in order.
    const uint32_t n_cut = __popc(in_cut);
    uint32_t incl = n_cut;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
    if (total) {
      uint32_t base = 0;
      if (lane == 0) base = atomicAdd(&st.n_cut, total);
      base = __shfl_sync(0xffffffffu, base, 0) + incl - n_cut;
      for (uint32_t m = in_cut; m; m &= m - 1) cut[base++] = j0 + lane * kBlockTokens + __ffs(m) - 1;
    }
    __syncwarp();  // the tile is reused by this warp's next chunk
  }
  if (sums) {
    heavy_mass = warp_sum(heavy_mass);
    resid_mass = warp_sum(resid_mass);
    if (lane == 0 && heavy_mass != 0.0) atomicAdd(&st.w_heavy, heavy_mass);
    if (lane == 0 && resid_mass != 0.0) atomicAdd(&st.w_resid_proxy, resid_mass);
  }
}

// The `need`-th largest of the 32-bit keys key(i) over the list entries i with
// use(i) (need >= 1 and at most their count), 8 bits a pass from the top. Returns
// the key; *rem is how many entries equal to it are among the `need` largest.
// Every thread of the block must call it.
template <typename KeyFn>
__device__ uint32_t block_select(uint32_t n, uint32_t need, KeyFn key, uint32_t* rem) {
  using Scan = cub::BlockScan<uint32_t, kRefineThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ uint32_t hist_s[256];
  __shared__ uint32_t prefix_s, rem_s;
  if (threadIdx.x == 0) {
    prefix_s = 0;
    rem_s = need;
  }
  for (int pass = 0; pass < 4; ++pass) {
    if (threadIdx.x < 256) hist_s[threadIdx.x] = 0;
    __syncthreads();
    const int shift = 24 - 8 * pass;
    const uint32_t mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    const uint32_t prefix = prefix_s;
    for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) {
      uint32_t kv;
      if (key(i, &kv) && (kv & mask) == prefix) atomicAdd(&hist_s[(kv >> shift) & 255u], 1u);
    }
    __syncthreads();
    const uint32_t bin = 255u - threadIdx.x;  // thread 0 holds the top bin
    const uint32_t c = threadIdx.x < 256 ? hist_s[bin] : 0u;
    const uint32_t kr = rem_s;
    uint32_t incl;
    Scan(tmp).InclusiveSum(c, incl);
    const uint32_t excl = incl - c;
    __syncthreads();  // everyone has read rem_s
    if (threadIdx.x < 256 && c > 0 && excl < kr && kr <= incl) {
      prefix_s = prefix | (bin << shift);
      rem_s = kr - excl;
    }
    __syncthreads();
  }
  *rem = rem_s;
  const uint32_t out = prefix_s;
  __syncthreads();  // the shared state may be reused by the next call
  return out;
}

// The `need` largest keys among the entries i < n with use(i) (1 <= need <= their
// count), ties to the lowest candidate index, as the CPU selects: visit(i, j, key,
// selected) is called once for every used entry. Every thread of the block calls it.
template <typename CandFn, typename KeyFn, typename UseFn, typename VisitFn>
__device__ void select_exact(uint32_t n, uint32_t need, CandFn cand, KeyFn key_of, UseFn use,
                             VisitFn visit) {
  uint32_t eq_need;
  const uint32_t thr = block_select(n, need, [&](uint32_t i, uint32_t* k) {
    if (!use(i)) return false;
    *k = key_of(i);
    return true;
  }, &eq_need);
  // Equal scores across the cut: keep the eq_need lowest candidate indices (the
  // largest ~j) among them.
  using Reduce = cub::BlockReduce<uint32_t, kRefineThreads>;
  __shared__ typename Reduce::TempStorage red;
  __shared__ uint32_t eq_s;
  uint32_t eq = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) eq += use(i) && key_of(i) == thr;
  const uint32_t eq_total = Reduce(red).Sum(eq);
  if (threadIdx.x == 0) eq_s = eq_total;
  __syncthreads();
  uint32_t max_j = 0xffffffffu;
  if (eq_s > eq_need) {
    uint32_t unused;
    max_j = ~block_select(n, eq_need, [&](uint32_t i, uint32_t* k) {
      if (!use(i) || key_of(i) != thr) return false;
      *k = ~cand(i);
      return true;
    }, &unused);
  }
  for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) {
    if (!use(i)) continue;
    const uint32_t key = key_of(i), j = cand(i);
    visit(i, j, key, key > thr || (key == thr && j <= max_j));
  }
}

// One block per row: the exact cut among the boundary list. Lists of up to
// `staged` candidates (the plan's refine_staged, dynamic shared memory) are first
// copied to shared memory with their keys, so the radix passes do not repeat the
// two dependent global loads per candidate.
__global__ void __launch_bounds__(kRefineThreads) refine_kernel(DecodeBatch b, Workspace ws,
                                                               uint32_t staged_cap) {
  stage_begin();
  extern __shared__ uint32_t refine_smem[];
  uint32_t* key_s = refine_smem;
  uint32_t* j_s = refine_smem + staged_cap;
  const Row r = row_here(b, ws);
  if (!r.sparse()) return;
  RowState& st = ws.rows[r.row];
  const uint32_t need = st.cut_need, n = min(st.n_cut, r.nc);
  if (st.topk_k == 0 || need == 0) return;
  uint32_t* bits = ws.heavy_bits + row_block_base(*r.it, r.h);
  const uint32_t* cut = ws.cut + row_token_base(*r.it, r.h);
  const bool staged = n <= staged_cap;
  if (staged) {
    for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) {
      const uint32_t j = cut[i];
      j_s[i] = j;
      key_s[i] = float_key(r.cand_scores[j]);
    }
    __syncthreads();
  }
  auto cand = [&](uint32_t i) { return staged ? j_s[i] : cut[i]; };
  auto key_of = [&](uint32_t i) { return staged ? key_s[i] : float_key(r.cand_scores[cut[i]]); };
  // With filter_sums_residual the filter left the list out of the residual sums:
  // the candidates refine leaves go in (integer atomics: exact in any order).
  const bool sums = filter_sums_residual(b), uniform = b.sampling == Sampling::kUniform;
  const float mx = key_float(st.max_key);
  const size_t bbase = row_block_base(*r.it, r.h), cbase = row_chunk_base(*r.it, r.h);
  double to_heavy = 0.0, to_resid = 0.0;  // statistics only
  auto add_resid = [&](uint32_t j, uint32_t key, bool add) {
    const CandWeight w = cand_weight(key_float(key), mx, uniform);
    const unsigned long long d = add ? w.fixed : 0ull - w.fixed;
    atomicAdd(reinterpret_cast<unsigned long long*>(&ws.bsum[bbase + (j >> 5)]), d);
    atomicAdd(reinterpret_cast<unsigned long long*>(&ws.csum[cbase + (j >> 10)]), d);
    return w.e;
  };
  auto visit_listed = [&](uint32_t, uint32_t j, uint32_t key, bool selected) {
    if (selected) {
      atomicOr(&bits[j >> 5], 1u << (j & 31));
      if (sums) to_heavy += cand_weight(key_float(key), mx, uniform).e;
    } else if (sums) {
      to_resid += add_resid(j, key, true);
    }
  };
  auto every = [](uint32_t) { return true; };
  if (need < n) {
    select_exact(n, need, cand, key_of, every, visit_listed);
  } else {
    for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) visit_listed(i, cand(i), key_of(i), true);
    if (need > n) {
      // The list fell short (a skewed sample): the rest from the whole row, among
      // the candidates below the list, which the filter counted as residual.
      const ScoreBins bins(st);
      const uint32_t last = st.cut_last;
      auto below = [&](uint32_t i) { return bins.bin(r.cand_scores[i]) > last; };
      auto row_key = [&](uint32_t i) { return float_key(r.cand_scores[i]); };
      auto self = [](uint32_t i) { return i; };
      select_exact(r.nc, need - n, self, row_key, below,
                   [&](uint32_t, uint32_t j, uint32_t key, bool selected) {
                     if (!selected) return;
                     atomicOr(&bits[j >> 5], 1u << (j & 31));
                     if (sums) {
                       const double e = add_resid(j, key, false);
                       to_heavy += e;
                       to_resid -= e;
                     }
                   });
    }
  }
  if (to_heavy != 0.0) atomicAdd(&st.w_heavy, to_heavy);
  if (to_resid != 0.0) atomicAdd(&st.w_resid_proxy, to_resid);
}

}  // namespace

void plan_topk(const DecodeBatch& b, WorkspacePlan* plan) {
  // Sample the histogram when every sparse row is long and its k small enough
  // that the list (k plus a few standard deviations of the sample) fits the
  // staged shared memory of refine.
  constexpr uint32_t kShift = 5, kSampledStaged = 24576, kExactStaged = 4096;
  bool sample = true;
  uint32_t longest = 0;
  for (uint32_t i = 0; i < b.n_items; ++i) {
    const DecodeItem& it = b.items[i];
    if (it.sink_end >= it.local_begin || it.n_select == 0) continue;
    const uint32_t nc = it.local_begin - it.sink_end;
    const uint32_t k = b.heavy == HeavyRule::kAdaptive ? it.n_select : it.n_heavy;
    const double list = k + 8.0 * std::sqrt(static_cast<double>(k) * (1u << kShift)) + 64.0;
    sample = sample && nc >= 16384 && k <= nc / 16 && list <= kSampledStaged;
    longest = std::max(longest, nc);
  }
  plan->topk_sample_shift = sample && longest > 0 ? kShift : 0;
  plan->refine_staged = plan->topk_sample_shift ? kSampledStaged : kExactStaged;
  // The sampled pass reads a thirty-second of the scores: fewer blocks, each
  // with at least 2048 samples.
  const uint32_t n_u = (plan->n_pad_max + (1u << plan->topk_sample_shift) - 1) >> plan->topk_sample_shift;
  plan->hist_blocks = std::clamp<uint32_t>((n_u + 2047) / 2048, 1, std::max(plan->scan_blocks, 1u));
}

cudaError_t launch_topk(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                        cudaStream_t st) {
  const dim3 hist_grid(plan.hist_blocks, b.shape.n_q_heads, b.n_items);
  const dim3 scan_grid(plan.scan_blocks, b.shape.n_q_heads, b.n_items);
  const dim3 row_grid(1, b.shape.n_q_heads, b.n_items);
  const size_t refine_smem = size_t{plan.refine_staged} * 2 * sizeof(uint32_t);
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(refine_kernel), refine_smem);
  // The histograms were zeroed by build_lut_kernel (PQ proxy) or init_rows_kernel.
  if (e == cudaSuccess) e = launch_stage(b, hist_kernel, hist_grid, kThreads, 0, st, b, ws, plan.topk_sample_shift);
  if (e == cudaSuccess) e = launch_stage(b, filter_kernel, scan_grid, kThreads, 0, st, b, ws);
  if (e == cudaSuccess)
    e = launch_stage(b, refine_kernel, row_grid, kRefineThreads, refine_smem, st, b, ws, plan.refine_staged);
  return e;
}

}  // namespace ssa::cuda
