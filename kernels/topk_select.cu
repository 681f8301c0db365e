// Top-k of each row's candidate scores, as a bitmap of the selected candidates.
// A histogram of the scores, one more pass over them, then work only on the few
// candidates near the cut:
//  1. histogram: every candidate's bin by distance below the top of the row's
//     range (ScoreBins, device_util.cuh: 1024 bins). The PQ scoring kernel bins
//     its scores as it writes them, over a range bounded from the lookup tables
//     (pq_score.cu); the exact proxy takes a pass here, over [min, max];
//  2. the cut (topk_cut.cuh, at the start of every filter block): the boundary
//     bin holding the k-th largest score, how many of its candidates are still
//     needed;
//  3. filter: writes the bitmap words of the bins above the boundary (selected
//     outright), appends the boundary bin's candidates to a short list and, for
//     the sampling methods with the fixed heavy rule, sums the residual weights
//     per block and chunk for the sampler (saving it a pass over the scores);
//  4. refine: one block per row radix-selects, over that list only, the exact
//     score bits of the k-th largest value (8 bits a pass) and, where equal
//     scores straddle the cut, the lowest token indices among them; it sets their
//     bits and takes them out of the residual sums.
// The selected set is exactly the CPU's top-k (ties to the lower index); the
// bitmap does not depend on thread timing, and kernels/bitmap_compact.cu turns it
// into a token-ordered list.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "cp_async.cuh"
#include "device_util.cuh"
#include "head_dim.cuh"  // ensure_dynamic_smem
#include "stage_launch.cuh"
#include "stages.h"
#include "topk_cut.cuh"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRefineThreads = 1024;
constexpr uint32_t kFilterWarps = kThreads / 32;
// Each filter warp has two chunk tiles, so that the copy of its next chunk is in
// flight while it works through the current one; three blocks of eight warps fill
// a multiprocessor's shared memory.
constexpr uint32_t kFilterTiles = 2;
constexpr uint32_t kFilterBlocksPerSm = 3;

struct Row {
  const DecodeItem* it;
  uint32_t h, row, nc;
  const float* cand_scores;  // scores of candidate 0 (token sink_end)
  __device__ bool sparse() const { return item_selects(*it); }
};

__device__ Row row_here(const DecodeBatch& b, const Workspace& ws) {
  Row r;
  r.it = &b.item(blockIdx.z);
  r.h = blockIdx.y;
  r.row = row_of(blockIdx.z, blockIdx.y, b.sel_heads());
  r.nc = r.it->local_begin - r.it->sink_end;
  r.cand_scores = ws.scores + row_token_base(*r.it, r.h) + r.it->sink_end;
  return r;
}

// The exact proxy's histogram (the PQ proxy bins while scoring, pq_score.cu),
// over the row's [min, max] score range (at most 32 logits).
__global__ void __launch_bounds__(kThreads) hist_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  const Row r = row_here(b, ws);
  if (!r.sparse() || requested_topk(b, *r.it) == 0) return;
  RowState& st = ws.rows[r.row];
  __shared__ uint32_t hist_s[kScoreBins];
  for (uint32_t i = threadIdx.x; i < kScoreBins; i += kThreads) hist_s[i] = 0;
  __syncthreads();
  const ScoreBins bins = ScoreBins::over(key_float(st.max_key), key_float(st.min_key), 32.f);
  if (blockIdx.x == 0 && threadIdx.x == 0) bins.store(st);
  const uint32_t per = (r.nc + gridDim.x - 1) / gridDim.x;
  const uint32_t begin = min(r.nc, blockIdx.x * per), end = min(r.nc, begin + per);
  // Four loads in flight per thread before their four shared-memory updates.
  for (uint32_t j0 = begin + threadIdx.x; j0 < end; j0 += 4 * kThreads) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t j = j0 + u * kThreads;
      v[u] = j < end ? r.cand_scores[j] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (j0 + u * kThreads < end) atomicAdd(&hist_s[bins.bin(v[u])], 1u);
    }
  }
  __syncthreads();
  uint32_t* hist = ws.hist + size_t{r.row} * kScoreBins;
  for (uint32_t i = threadIdx.x; i < kScoreBins; i += kThreads) {
    if (hist_s[i]) atomicAdd(&hist[i], hist_s[i]);
  }
}

// Float4 v of a staged chunk (block v / 8, float4 v % 8 of it) sits at column
// (v % 8) ^ (block % 8) of its block's row: the eight lanes of a quarter warp,
// each reading float4 g of its own block, then hit eight different bank groups.
constexpr uint32_t kChunkVecs = kChunkTokens / 4;
__device__ __forceinline__ uint32_t swizzled(uint32_t v) { return v ^ ((v >> 3) & 7u); }

// One warp per 1024-candidate chunk, each lane owning one 32-candidate block (its
// bitmap word, its boundary-bin candidates and, with filter_sums_residual, its
// residual weight sum for the sampler, in the layout stratified_sample.cu reads).
// Each warp stages a whole chunk in one of its two shared-memory tiles first, then
// each lane reads down its own row: with 16-byte asynchronous copies where the
// row's candidates start 16 bytes aligned (sink_end % 4 == 0), issued one chunk
// ahead so that the copy of the next chunk overlaps the work on this one, else with
// coalesced 4-byte loads (load_chunk_tile). The row's last, partial chunk of an
// aligned row is read directly with 16-byte loads instead, masked at its end.
// Boundary-bin candidates are counted as residual here; refine subtracts those
// it selects.
// kSums: filter_sums_residual; kUniform: uniform sampling weights. Both fixed per
// launch, so that the per-candidate work carries no test for either (the SSA
// filter is bound by its instructions).
template <bool kSums, bool kUniform>
__global__ void __launch_bounds__(kThreads, kFilterBlocksPerSm) filter_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  extern __shared__ float4 filter_smem[];  // kFilterTiles chunk tiles per warp
  const Row r = row_here(b, ws);
  if (!r.sparse()) return;
  RowState& st = ws.rows[r.row];
  // The cut, found by every block for itself; the first block records it for
  // refine and the later stages.
  uint32_t k = requested_topk(b, *r.it), cut_bin = 0, cut_need = 0;
  if (k > 0) {
    const TopkCut tc = find_topk_cut<kThreads>(ws.hist + size_t{r.row} * kScoreBins, k);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      st.topk_k = tc.k;
      if (b.heavy == HeavyRule::kFixed) st.n_heavy = tc.k;
      st.cut_bin = tc.cut_bin;
      st.cut_need = tc.cut_need;
    }
    k = tc.k;
    cut_bin = tc.cut_bin;
    cut_need = tc.cut_need;
  }
  const bool collect = k > 0 && cut_need > 0;
  const ScoreBins bins = ScoreBins::of_row(st);
  // Sampling weights exp(s~ - max); a row whose candidates are all -inf (only
  // from non-finite inputs) gets weight 0 everywhere, as cand_weight gives.
  const float mx = st.max_key == float_key(-INFINITY) ? 0.f : key_float(st.max_key);
  const size_t bbase = row_block_base(*r.it, r.h), cbase = row_chunk_base(*r.it, r.h);
  uint32_t* cut = ws.cut + size_t{r.row} * ws.cut_capacity;
  const uint32_t chunks = (r.nc + kChunkTokens - 1) / kChunkTokens;
  const uint32_t per = (chunks + gridDim.x - 1) / gridDim.x;
  const uint32_t c_begin = min(chunks, blockIdx.x * per), c_end = min(chunks, c_begin + per);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const bool aligned = cand_scores_aligned(*r.it);
  ChunkTile* tiles = reinterpret_cast<ChunkTile*>(filter_smem) + kFilterTiles * warp;
  // A whole chunk of an aligned row is copied into a tile with coalesced 16-byte
  // cp.async ([32 blocks][8 float4], swizzled), one commit group per chunk (empty
  // for the other chunks, so that the wait below counts the same either way).
  auto copied = [&](uint32_t c) { return aligned && (c + 1) * kChunkTokens <= r.nc; };
  auto copy_chunk = [&](uint32_t c, ChunkTile& t) {
    if (c < c_end && copied(c)) {
      const float4* src = reinterpret_cast<const float4*>(r.cand_scores + c * kChunkTokens);
      float4* t4 = reinterpret_cast<float4*>(&t);
#pragma unroll
      for (uint32_t q = 0; q < kChunkVecs / 32; ++q) {
        const uint32_t v = q * 32 + lane;
        cp_async16(&t4[swizzled(v)], src + v, 16);
      }
    }
    cp_async_commit();
  };
  copy_chunk(c_begin + warp, tiles[0]);
  uint32_t cur = 0;
  double heavy_mass = 0.0, resid_mass = 0.0;  // statistics (RowState::w_heavy, w_resid_proxy)
  for (uint32_t c = c_begin + warp; c < c_end; c += kFilterWarps, cur ^= 1u) {
    ChunkTile& tile = tiles[cur];
    const float4* tile4 = reinterpret_cast<const float4*>(&tile);
    // The next chunk's copy goes out before this one is used.
    copy_chunk(c + kFilterWarps, tiles[cur ^ 1u]);
    cp_async_wait<1>();
    __syncwarp();
    const uint32_t j0 = c * kChunkTokens;
    const uint32_t n_here = min(kChunkTokens, r.nc - j0);
    if (!aligned) load_chunk_tile(tile, r.cand_scores + j0, n_here, lane);
    const uint32_t n_mine = lane * kBlockTokens < n_here ? min(kBlockTokens, n_here - lane * kBlockTokens) : 0u;
    uint32_t sel = 0, in_cut = 0;
    uint64_t resid = 0;
    // Statistics: float within a block, double across. With proportional weights
    // the residual's mass is its fixed-point sum over 2^38 (no float sum of it).
    float heavy_blk = 0.f, resid_blk = 0.f;
    auto step = [&](float v, uint32_t i, bool valid) {
      const uint32_t bin = valid ? bins.bin(v) : kScoreBins;  // kScoreBins: none
      const bool heavy = bin < cut_bin;
      sel |= uint32_t{heavy} << i;
      in_cut |= uint32_t{collect && bin == cut_bin} << i;
      if constexpr (kSums) {
        const CandWeight w = cand_weight_of<kUniform>(v, mx);
        if (heavy) {
          heavy_blk += w.e;
        } else {
          resid += w.fixed;
          if constexpr (kUniform) resid_blk += w.e;
        }
      }
    };
    // The row's last, partial chunk: direct 16-byte loads, eight candidates at a
    // time, masked past its end.
    auto direct_partial = [&]() {
      const float4* p = reinterpret_cast<const float4*>(r.cand_scores + j0 + lane * kBlockTokens);
#pragma unroll
      for (uint32_t g = 0; g < kBlockTokens / 8; ++g) {
        float v[8];
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t i = 8 * g + 4 * h;
          const float4 a = i < n_mine ? p[2 * g + h] : make_float4(0.f, 0.f, 0.f, 0.f);
          v[4 * h] = a.x; v[4 * h + 1] = a.y; v[4 * h + 2] = a.z; v[4 * h + 3] = a.w;
        }
#pragma unroll
        for (uint32_t q = 0; q < 8; ++q) {
          const uint32_t i = 8 * g + q;
          const bool in = i < n_mine;
          step(in ? v[q] : -INFINITY, i, k > 0 && in);
        }
      }
    };
    if (!aligned) {
#pragma unroll 8
      for (uint32_t i = 0; i < kBlockTokens; ++i) step(tile[lane][i], i, k > 0 && i < n_mine);
    } else if (n_here == kChunkTokens) {
      // A whole chunk, copied into the tile (copy_chunk): lane l reads its block,
      // row l. Direct 16-byte loads per lane (each a different 128-byte line) leave
      // the warps waiting on memory.
#pragma unroll
      for (uint32_t g = 0; g < kBlockTokens / 4; ++g) {
        const float4 a = tile4[swizzled(lane * (kBlockTokens / 4) + g)];
        const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (uint32_t q = 0; q < 4; ++q) step(v[q], 4 * g + q, k > 0);
      }
    } else {
      direct_partial();
    }
    heavy_mass += heavy_blk;
    resid_mass += kUniform ? static_cast<double>(resid_blk) : static_cast<double>(resid) * (1.0 / kWeightOne);
    const uint32_t blk = c * kBlocksPerChunk + lane;
    ws.heavy_bits[bbase + blk] = sel;
    if constexpr (kSums) {
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
      // Past the list's capacity only the count goes on (refine then scans).
      for (uint32_t m = in_cut; m; m &= m - 1, ++base)
        if (base < ws.cut_capacity) cut[base] = j0 + lane * kBlockTokens + __ffs(m) - 1;
    }
    __syncwarp();  // the tile is copied over two chunks later
  }
  if constexpr (kSums) {
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

// One block per row: exact cut inside the boundary bin's candidate list. Lists of
// up to kStaged candidates are first copied to shared memory with their keys, so
// the radix passes do not repeat the two dependent global loads per candidate.
// A boundary bin longer than its list (Workspace::cut_capacity) is read from the
// row's scores instead, every candidate tested for the bin: slow, but it only
// happens with many equal or nearly equal scores.
constexpr uint32_t kStaged = 4096;
static_assert(kStaged <= kCutListMin, "a list refine stages whole always fits");

__global__ void __launch_bounds__(kRefineThreads) refine_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  __shared__ uint32_t key_s[kStaged], j_s[kStaged];
  const Row r = row_here(b, ws);
  if (!r.sparse()) return;
  RowState& st = ws.rows[r.row];
  const uint32_t need = st.cut_need, n_cut = min(st.n_cut, r.nc);
  if (st.topk_k == 0 || need == 0 || n_cut == 0) return;
  uint32_t* bits = ws.heavy_bits + row_block_base(*r.it, r.h);
  const uint32_t* cut = ws.cut + size_t{r.row} * ws.cut_capacity;
  const bool listed = n_cut <= ws.cut_capacity;
  const uint32_t n = listed ? n_cut : r.nc;  // list entries, or every candidate of the row
  const ScoreBins bins = ScoreBins::of_row(st);
  const uint32_t cut_bin = st.cut_bin;
  const bool staged = listed && n <= kStaged;
  if (staged) {
    for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) {
      const uint32_t j = cut[i];
      j_s[i] = j;
      key_s[i] = float_key(r.cand_scores[j]);
    }
    __syncthreads();
  }
  auto cand = [&](uint32_t i) { return staged ? j_s[i] : listed ? cut[i] : i; };
  auto key_of = [&](uint32_t i) { return staged ? key_s[i] : float_key(r.cand_scores[cand(i)]); };
  // In the boundary bin (always, for list entries), as the filter bins it.
  auto member = [&](uint32_t i) { return listed || bins.bin(r.cand_scores[i]) == cut_bin; };
  uint32_t thr = 0, eq_need = 0, max_j = 0xffffffffu;
  if (need < n_cut) {
    thr = block_select(n, need, [&](uint32_t i, uint32_t* k) {
      *k = key_of(i);
      return member(i);
    }, &eq_need);
    // Equal scores across the cut: keep the eq_need lowest token indices (the
    // largest ~j) among them, as the CPU does.
    using Reduce = cub::BlockReduce<uint32_t, kRefineThreads>;
    __shared__ typename Reduce::TempStorage red;
    uint32_t eq = 0;
    for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) eq += member(i) && key_of(i) == thr;
    __shared__ uint32_t eq_s;
    const uint32_t eq_total = Reduce(red).Sum(eq);
    if (threadIdx.x == 0) eq_s = eq_total;
    __syncthreads();
    if (eq_s > eq_need) {
      uint32_t unused;
      max_j = ~block_select(n, eq_need, [&](uint32_t i, uint32_t* k) {
        *k = ~cand(i);
        return member(i) && key_of(i) == thr;
      }, &unused);
    }
  }
  // Set the bits; with filter_sums_residual, take the selected candidates out of
  // the residual sums the filter counted them in (integer atomics: exact).
  const bool sums = filter_sums_residual(b), uniform = b.sampling == Sampling::kUniform;
  const float mx = key_float(st.max_key);
  const size_t bbase = row_block_base(*r.it, r.h), cbase = row_chunk_base(*r.it, r.h);
  double moved = 0.0;
  for (uint32_t i = threadIdx.x; i < n; i += kRefineThreads) {
    if (!member(i)) continue;
    const uint32_t j = cand(i);
    const uint32_t key = key_of(i);
    if (need >= n_cut || key > thr || (key == thr && j <= max_j)) {
      atomicOr(&bits[j >> 5], 1u << (j & 31));
      if (sums) {
        const CandWeight w = cand_weight(key_float(key), mx, uniform);
        const unsigned long long minus = 0ull - w.fixed;
        atomicAdd(reinterpret_cast<unsigned long long*>(&ws.bsum[bbase + (j >> 5)]), minus);
        atomicAdd(reinterpret_cast<unsigned long long*>(&ws.csum[cbase + (j >> 10)]), minus);
        moved += w.e;
      }
    }
  }
  if (moved != 0.0) {  // statistics only
    atomicAdd(&st.w_heavy, moved);
    atomicAdd(&st.w_resid_proxy, -moved);
  }
}

}  // namespace

uint32_t filter_blocks_per_row(uint32_t n_pad_max, uint32_t rows, uint32_t scan_blocks, int sm_count) {
  // A warp takes whole chunks: no more blocks than give each warp one of the
  // longest row's chunks (fewer than the histogram's for short rows).
  const uint32_t chunk_blocks = (n_pad_max / kChunkTokens + kFilterWarps - 1) / kFilterWarps;
  uint32_t n = std::max(1u, std::min(scan_blocks, chunk_blocks));
  // And no second wave that leaves most multiprocessors idle (a grid of a little
  // more than one wave runs its tail with most warps inactive). Rows that fill a
  // wave take what fills it whole.
  const uint32_t wave = kFilterBlocksPerSm * static_cast<uint32_t>(std::max(sm_count, 1));
  if (uint64_t{rows} * n > wave) n = std::max(1u, std::min(n, wave / std::max(rows, 1u)));
  return n;
}

cudaError_t launch_topk(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                        cudaStream_t st) {
  const dim3 scan_grid(plan.scan_blocks, b.sel_heads(), b.n_items);
  const dim3 row_grid(1, b.sel_heads(), b.n_items);
  // The PQ proxy's histograms are built by its scoring kernel; the exact proxy's
  // and the mixture's were zeroed by init_rows_kernel.
  cudaError_t e = cudaSuccess;
  if (b.proxy != Proxy::kPq || b.group == GroupProposal::kMixture)
    e = launch_stage(b, hist_kernel, scan_grid, kThreads, 0, st, b, ws);
  // Every warp stages its chunks in two tiles of its own (whole chunks of aligned
  // rows as copies, one chunk ahead; unaligned rows through load_chunk_tile).
  const size_t tiles = kFilterTiles * kFilterWarps * sizeof(ChunkTile);
  const dim3 filter_grid(plan.filter_blocks, b.sel_heads(), b.n_items);
  const auto filter = !filter_sums_residual(b)              ? filter_kernel<false, false>
                      : b.sampling == Sampling::kUniform ? filter_kernel<true, true>
                                                         : filter_kernel<true, false>;
  if (e == cudaSuccess) e = ensure_dynamic_smem(reinterpret_cast<const void*>(filter), tiles);
  if (e == cudaSuccess) e = launch_stage(b, filter, filter_grid, kThreads, tiles, st, b, ws);
  if (e == cudaSuccess) e = launch_stage(b, refine_kernel, row_grid, kRefineThreads, 0, st, b, ws);
  return e;
}

}  // namespace ssa::cuda
