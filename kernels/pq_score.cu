// Proxy scores of every token of every row, with the sink and local tokens masked
// (-inf) in the same pass (q is pre-multiplied by 1/sqrt(d), as on the CPU):
//   PQ:    s~_i = sum_m LUT[m][code_i[m]], LUT[m][c] = (q_m / sqrt(d)) . centroid[m][c];
//          one block reads the codes of its tokens once for all q heads of a GQA
//          group (up to 8 heads per pass, their tables in shared memory). OPQ and
//          QPQ multiply q by the KV head's query transform first; 4-bit codes
//          score from byte tables (pq4_score_kernel).
//   exact: s_i = q . k_i / sqrt(d) (oracle top-k), reading every key.
// Both also record each row's largest and smallest candidate scores
// (order-preserving bits). The PQ kernel also builds each row's top-k histogram
// (topk_select.cu) as it writes the scores, which saves the top-k stage a pass
// over them. Its bins must be known before any score is; they span
// [sum_m mean_c LUT[m][c], sum_m max_c LUT[m][c]] (pq_score_bins), from what
// the lookup-table kernel records of each table.
//
// Why the PQ tables are laid out [c][m] and each lane walks the subspaces in its
// own rotated order: table reads are gathers at random codes, and with the entries
// of one subspace side by side ([m][c]) the lanes of a warp hit the same shared-memory
// banks at random, about 2.5x the ideal number of wavefronts. With [c][m] the bank
// of an entry depends only on m, so lanes that read different subspaces at the same
// step never conflict, whatever the codes. The sum order then differs per lane (and
// from the CPU's m = 0..M-1); scores agree with it to float rounding, and the
// lookup tables themselves match it bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "cp_async.cuh"
#include "device_util.cuh"
#include "head_dim.cuh"
#include "row_init.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

// PQ scoring: 512 threads of 4 tokens (one 32-bit code word per subspace), two
// blocks per multiprocessor. The kernel waits on its shared-memory table reads,
// so it wants warps: with one buffer of code words instead of two, two
// 512-thread blocks fit (32 warps per SM instead of 16 with 256 threads and
// double-buffered codes).
constexpr int kScoreThreads = 512;
constexpr int kScoreBlocksPerSm = 2;  // launch bounds: 64 registers (eight heads a pass: one
                                      // block, its 192 KB of shared memory, no spills)
constexpr int kTokensPerThread = 4;
constexpr uint32_t kSubTile = kScoreThreads * kTokensPerThread;  // 2048 tokens per pass
constexpr size_t kScoreSmemLimit = 220 * 1024;

// The GH heads' entries of one (code, subspace) pair are stored as P vectors of W
// floats: GH = 1, 2, 4 -> one float, float2, float4; GH = 8 -> two float4 planes.
template <int GH>
struct LutVec {
  static constexpr int W = GH >= 4 ? 4 : GH;
  static constexpr int P = GH / W;
};

// Offset (floats) of head g's entry for (subspace m, code c) inside the tables of
// one pass over GH heads: [plane][c][m][W].
template <int GH>
__host__ __device__ __forceinline__ uint32_t lut_offset(uint32_t g, uint32_t m, uint32_t c,
                                                       uint32_t M, uint32_t K) {
  constexpr int W = LutVec<GH>::W;
  return ((g / W * K + c) * M + m) * W + g % W;
}

// 4-bit codes: the byte tables of four heads [planes][16][M] (words), one pass of
// code words [M / 2][threads], each table's least and largest entry [2][GH][M],
// the GH rows' histograms.
size_t pq4_nibble_smem_bytes(int gh, const DecodeShape& s) {
  const size_t planes = (static_cast<uint32_t>(gh) + 3) / 4;
  return (planes * 16 * s.pq_subspaces + size_t{s.pq_subspaces / 2} * kScoreThreads +
          2 * size_t{static_cast<uint32_t>(gh)} * s.pq_subspaces + size_t{static_cast<uint32_t>(gh)} * kScoreBins) *
         sizeof(uint32_t);
}

// A code byte holds the codes of subspaces 2r and 2r + 1; a table per byte
// position r gives both entries' sum in one lookup (pq4_score_kernel). Tables
// [planes][256][RS] of two words (16-bit lanes: heads 4p and 4p + 2, then 4p + 1 and
// 4p + 3). The row stride RS is a multiple of 16: the 16 lanes of a half-warp,
// at 16 consecutive byte positions, then hit 32 different banks.
__host__ __device__ uint32_t pq4_pair_stride(const DecodeShape& s) { return (s.pq_subspaces / 2 + 15) / 16 * 16; }
size_t pq4_pair_bytes(int gh, const DecodeShape& s) {
  const size_t planes = (static_cast<uint32_t>(gh) + 3) / 4;
  return planes * 256 * pq4_pair_stride(s) * sizeof(uint2);
}
// Whether the 4-bit kernel of GH heads per pass has room for the byte-pair
// tables (up to 64 subspaces with four heads a pass); else it looks up nibbles.
bool pq4_pairs(int gh, const DecodeShape& s) {
  return pq4_nibble_smem_bytes(gh, s) + pq4_pair_bytes(gh, s) <= kScoreSmemLimit;
}

size_t score_smem_bytes(int gh, const DecodeShape& s) {
  if (s.pq_code_bits == 4)
    return pq4_nibble_smem_bytes(gh, s) + (pq4_pairs(gh, s) ? pq4_pair_bytes(gh, s) : 0);
  // tables + one pass of code words + the GH rows' top-k histograms
  const size_t hist = size_t{static_cast<uint32_t>(gh)} * kScoreBins * sizeof(uint32_t);
  return (size_t{static_cast<uint32_t>(gh)} * s.pq_centroids + kScoreThreads) *
             s.pq_subspaces * sizeof(float) + hist;
}

// Subspaces of up to this many dimensions load each centroid as float4s.
constexpr uint32_t kLutVecDims = 32;

// Row r . x of a query transform, as the CPU's rotate() (lib/index/pq_index.cc)
// computes it: eight interleaved partial sums added pairwise in its order, every
// product and sum rounded on its own, so that the tables match the CPU's bits.
__device__ float transform_row(const float* r, const float* x, uint32_t d) {
  const uint32_t d8 = d / 8 * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (uint32_t j = 0; j < d8; j += 8) {
#pragma unroll
    for (uint32_t k = 0; k < 8; ++k) acc[k] = __fadd_rn(acc[k], __fmul_rn(r[j + k], x[j + k]));
  }
  float s = __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                      __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
  for (uint32_t j = d8; j < d; ++j) s = __fadd_rn(s, __fmul_rn(r[j], x[j]));
  return s;
}

// One block per (subspace, pass of GH q heads, item), one thread per centroid:
// each centroid is loaded once for the GH heads scored together, and their GH
// entries are stored as the vectors the scoring kernel reads (4x fewer blocks
// and stores than a block per head). Also records each table's largest and mean
// entry (the scoring kernel's histogram range).
template <typename T, int GH>
__global__ void build_lut_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  // The scoring grid may start now: before its own wait it only copies code
  // words, which no decode stage writes.
  stage_release_dependents();
  constexpr int W = LutVec<GH>::W, P = LutVec<GH>::P;
  const uint32_t m = blockIdx.x, h0 = blockIdx.y * GH, item = blockIdx.z;
  const DecodeItem& it = b.item(item);
  const uint32_t row0 = row_of(item, h0, b.sel_heads());
  if (m == 0) {  // the rows' initial states (init_rows_kernel's work)
    for (int g = 0; g < GH; ++g) clear_row_sums(ws, row0 + g, b.n_items * b.sel_heads());
    for (uint32_t g = threadIdx.x; g < GH; g += blockDim.x) ws.rows[row0 + g] = initial_row(b, it);
  }
  if (!item_selects(it)) return;  // dense or window-only item: no proxy
  const uint32_t M = b.shape.pq_subspaces, K = b.shape.pq_centroids;
  const uint32_t D = b.shape.head_dim, sub = D / M;
  const uint32_t kvh = h0 / b.sel_group();
  extern __shared__ float qs[];  // [GH][sub], then (a query transform) [GH][D]
  __shared__ uint32_t top_s[GH];  // order-preserving bits of each head's largest entry
  __shared__ float part_s[GH][256];  // each thread's sum of its entries, per head
  for (uint32_t g = threadIdx.x; g < GH; g += blockDim.x) top_s[g] = 0u;
  // As the CPU backend: q pre-multiplied by 1/sqrt(d), products and sums rounded
  // one by one (no fused multiply-add), so the tables match it bit for bit.
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const float* cb = it.codebooks + (size_t{kvh} * M + m) * K * sub;
  // The centroid's floats as 16-byte loads, all issued before the sums (a chain of
  // dependent loads otherwise); the same order of operations. The thread's first
  // centroid is requested before the block barrier that publishes q, so the two
  // loads overlap.
  const bool vec = sub % 4 == 0 && sub <= kLutVecDims;
  float4 x[kLutVecDims / 4];
  auto load_centroid = [&](uint32_t c) {
    const float4* cc = reinterpret_cast<const float4*>(cb + size_t{c} * sub);
#pragma unroll
    for (uint32_t i = 0; i < kLutVecDims / 4; ++i)
      if (4 * i < sub) x[i] = cc[i];
  };
  if (vec && threadIdx.x < K) load_centroid(threadIdx.x);
  // The rows' scaled queries, restricted to subspace m: qs[g][j] = q_g[m * sub + j];
  // with a query transform, q_g is first made whole in qf and qs[g][j] is row
  // m * sub + j of the transform times it (the CPU's rotate_query, to the bit).
  const float* xf = it.query_transform;
  float* qf = qs + GH * sub;  // [GH][D], only with a transform
  const uint32_t j0 = xf != nullptr ? 0 : m * sub, width = xf != nullptr ? D : sub;
  float* qdst = xf != nullptr ? qf : qs;
  if (b.grouped()) {
    // The group's mean query (GH = 1: one selection head, the KV head), as the
    // CPU's mean_query: the scaled queries summed in head order, then divided.
    const uint32_t G = b.shape.group();
    const T* q = static_cast<const T*>(it.q) + size_t{kvh} * G * D + j0;
    for (uint32_t j = threadIdx.x; j < width; j += blockDim.x) {
      float s = 0.f;
      for (uint32_t g = 0; g < G; ++g) s = __fadd_rn(s, __fmul_rn(Elem<T>::load(q + size_t{g} * D + j), scale));
      qdst[j] = __fdiv_rn(s, static_cast<float>(G));
    }
  } else {
    const T* q = static_cast<const T*>(it.q) + size_t{h0} * D + j0;
    for (uint32_t i = threadIdx.x; i < GH * width; i += blockDim.x) {
      const uint32_t g = i / width, j = i % width;
      qdst[i] = Elem<T>::load(q + size_t{g} * D + j) * scale;
    }
  }
  if (xf != nullptr) {
    __syncthreads();
    const float* rows = xf + (size_t{kvh} * D + m * sub) * D;
    for (uint32_t i = threadIdx.x; i < GH * sub; i += blockDim.x) {
      const uint32_t g = i / sub, j = i % sub;
      qs[i] = transform_row(rows + size_t{j} * D, qf + size_t{g} * D, D);
    }
  }
  __syncthreads();
  // The tables of the GH heads, in the layout the scoring kernel copies straight
  // into shared memory.
  float* out = ws.lut + size_t{row0} * M * K;
  uint32_t hi[GH];
  float part[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    hi[g] = 0u;
    part[g] = 0.f;
  }
  for (uint32_t c = threadIdx.x; c < K; c += blockDim.x) {
    float acc[GH];
#pragma unroll
    for (int g = 0; g < GH; ++g) acc[g] = 0.f;
    if (vec) {
      if (c != threadIdx.x) load_centroid(c);
#pragma unroll
      for (uint32_t i = 0; i < kLutVecDims / 4; ++i) {
        if (4 * i >= sub) break;
#pragma unroll
        for (int g = 0; g < GH; ++g) {
          const float* qg = qs + g * sub + 4 * i;
          acc[g] = __fadd_rn(acc[g], __fmul_rn(qg[0], x[i].x));
          acc[g] = __fadd_rn(acc[g], __fmul_rn(qg[1], x[i].y));
          acc[g] = __fadd_rn(acc[g], __fmul_rn(qg[2], x[i].z));
          acc[g] = __fadd_rn(acc[g], __fmul_rn(qg[3], x[i].w));
        }
      }
    } else {
      const float* cc = cb + size_t{c} * sub;
      for (uint32_t j = 0; j < sub; ++j) {
        const float xj = cc[j];
#pragma unroll
        for (int g = 0; g < GH; ++g) acc[g] = __fadd_rn(acc[g], __fmul_rn(qs[g * sub + j], xj));
      }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float* e = out + lut_offset<GH>(p * W, m, c, M, K);
      if constexpr (W == 1) {
        e[0] = acc[0];
      } else if constexpr (W == 2) {
        *reinterpret_cast<float2*>(e) = make_float2(acc[0], acc[1]);
      } else {
        *reinterpret_cast<float4*>(e) =
            make_float4(acc[4 * p], acc[4 * p + 1], acc[4 * p + 2], acc[4 * p + 3]);
      }
    }
#pragma unroll
    for (int g = 0; g < GH; ++g) {
      hi[g] = max(hi[g], float_key(acc[g]));
      part[g] += acc[g];
    }
  }
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    if (hi[g] != 0u) atomicMax(&top_s[g], hi[g]);
    part_s[g][threadIdx.x] = part[g];
  }
  __syncthreads();
  // Each head's mean in a fixed order, so that the bins (and the boundary list)
  // are the same in every run: strided partial sums in one warp per head, then a
  // butterfly (whole warps only; a block of fewer than 32 threads sums in lane 0).
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t n_warps = max(1u, blockDim.x / 32);
  for (uint32_t g = warp; warp < n_warps && g < GH; g += n_warps) {
    float sum = 0.f;
    if (blockDim.x >= 32) {
      for (uint32_t i = lane; i < blockDim.x; i += 32) sum += part_s[g][i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    } else if (lane == 0) {
      for (uint32_t i = 0; i < blockDim.x; ++i) sum += part_s[g][i];
    }
    if (lane == 0) {
      float* r = ws.lut_range + (size_t{row0 + g} * M + m) * 2;
      r[0] = key_float(top_s[g]);
      r[1] = sum / static_cast<float>(K);
    }
  }
}

// The histogram bins of one row's scores, from its tables. Every score is a sum
// of one entry per subspace, so none lies above the sum of the tables' maxima
// (one that rounds past it lands in bin 0). The bins reach down only to the sum
// of their means, the score of a token whose codes were spread uniformly: about
// the middle of the scores, so the top half (where a top-k of up to about half
// the candidates cuts) gets bins twice as fine as over the whole range, and the
// boundary bin half as many candidates. A top-k of more cuts in the last bin,
// which holds everything lower: still exact, with a long boundary list.
__device__ ScoreBins pq_score_bins(const float* range, uint32_t M) {
  float hi = 0.f, mean = 0.f;
  for (uint32_t m = 0; m < M; ++m) {
    hi += range[2 * m];
    mean += range[2 * m + 1];
  }
  return ScoreBins::over(hi, mean, INFINITY);
}

// One (code, subspace) pair's entries for the GH heads, vector loads.
template <int GH>
__device__ __forceinline__ void lut_entries(const float* lut_s, uint32_t m, uint32_t c, uint32_t M,
                                            uint32_t K, float* v) {
  constexpr int W = LutVec<GH>::W, P = LutVec<GH>::P;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float* e = lut_s + lut_offset<GH>(p * W, m, c, M, K);
    if constexpr (W == 1) {
      v[0] = e[0];
    } else if constexpr (W == 2) {
      const float2 a = *reinterpret_cast<const float2*>(e);
      v[0] = a.x; v[1] = a.y;
    } else {
      const float4 a = *reinterpret_cast<const float4*>(e);
      v[p * 4] = a.x; v[p * 4 + 1] = a.y; v[p * 4 + 2] = a.z; v[p * 4 + 3] = a.w;
    }
  }
}

// The entries of code byte j of cw for subspace m, when the tables have 16
// subspaces and whole float4 vectors (GH >= 4): entry (c, m) of a plane starts at
// byte c * 256 + m * 16, and one byte permute puts c * 256 in place (the general
// loop extracts the byte, multiplies by M and scales: 4 of its 9 SASS instructions
// per code byte). m_base points at subspace m's entries of code 0.
template <int GH>
__device__ __forceinline__ void lut_entries_m16(const char* m_base, uint32_t cw, uint32_t j, float* v) {
  constexpr int P = LutVec<GH>::P;
  constexpr uint32_t kPlaneBytes = 256u * 16u * 16u;  // K = 256 codes, M = 16, 16 bytes
  const uint32_t off = __byte_perm(cw, 0u, 0x4404u | (j << 4));  // byte j of cw, times 256
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float4 a = *reinterpret_cast<const float4*>(m_base + p * kPlaneBytes + off);
    v[p * 4] = a.x; v[p * 4 + 1] = a.y; v[p * 4 + 2] = a.z; v[p * 4 + 3] = a.w;
  }
}

// A score block's epilogue: each row's extreme score keys (the warps', then the
// block's, then the row state's) and the block's score histograms added into the
// rows' (the GH rows are consecutive from row0). Every thread of the block calls it.
template <int GH>
__device__ __forceinline__ void flush_block_stats(const uint32_t* local_max, const uint32_t* local_min, uint32_t* smax,
                                                  uint32_t* smin, const uint32_t* hist_s, const Workspace& ws,
                                                  uint32_t row0) {
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    const uint32_t w = __reduce_max_sync(0xffffffffu, local_max[g]);
    const uint32_t v = __reduce_min_sync(0xffffffffu, local_min[g]);
    if ((threadIdx.x & 31) == 0 && w != 0u) {
      atomicMax(&smax[g], w);
      atomicMin(&smin[g], v);
    }
  }
  __syncthreads();
  if (threadIdx.x < GH && smax[threadIdx.x] != 0u) {
    atomicMax(&ws.rows[row0 + threadIdx.x].max_key, smax[threadIdx.x]);
    atomicMin(&ws.rows[row0 + threadIdx.x].min_key, smin[threadIdx.x]);
  }
  uint32_t* hist = ws.hist + size_t{row0} * kScoreBins;
  for (uint32_t i = threadIdx.x; i < GH * kScoreBins; i += kScoreThreads) {
    if (hist_s[i]) atomicAdd(&hist[i], hist_s[i]);
  }
}

// kM16: 16 subspaces of 256 codes with GH >= 4 (lut_entries_m16); otherwise any
// table shape through lut_entries.
template <int GH, bool kM16>
__global__ void __launch_bounds__(kScoreThreads, GH >= 8 ? 1 : kScoreBlocksPerSm) pq_score_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
                                                                uint32_t tile) {
  extern __shared__ float4 smem4[];
  float* lut_s = reinterpret_cast<float*>(smem4);  // [P][K][M][W], see lut_offset
  __shared__ uint32_t smax[GH], smin[GH];
  __shared__ ScoreBins bins_s[GH];
  const uint32_t item = blockIdx.z;
  const DecodeItem& it = b.item(item);
  const uint32_t tile0 = blockIdx.x * tile;
  if (!item_selects(it) || tile0 >= it.n_tokens) return;
  const uint32_t M = b.shape.pq_subspaces, K = b.shape.pq_centroids;
  // Each thread's code words of its current 4 tokens, one row per subspace: the
  // rotated walk below indexes them by a lane-dependent m.
  uint32_t* codes_s = reinterpret_cast<uint32_t*>(lut_s + size_t{GH} * M * K) + threadIdx.x;  // [M][threads]
  uint32_t* hist_s = reinterpret_cast<uint32_t*>(lut_s + size_t{GH} * M * K) + M * kScoreThreads;  // [GH][bins]
  const uint32_t G = b.sel_group();  // selection heads per KV head
  const uint32_t chunks = G / GH;
  const uint32_t kvh = blockIdx.y / chunks;
  const uint32_t h0 = kvh * G + (blockIdx.y % chunks) * GH;  // first selection head
  const uint32_t row0 = row_of(item, h0, b.sel_heads());
  const uint32_t m_first = (threadIdx.x & 31) % M;
  const uint32_t tile_end = min(it.n_tokens, tile0 + tile);
  // Each pass's code words, copied by each thread for itself and read only by
  // it (no block barrier; its reads of the previous pass's words have returned
  // before it copies over them, since the scores it stored depend on them).
  // While one warp waits for its copies, the others look up.
  auto stage_codes = [&](uint32_t sub0) {
    const uint32_t t0 = sub0 + threadIdx.x * kTokensPerThread;
    if (t0 < tile_end) {
      const uint32_t page = t0 >> b.shape.page_shift;
      const uint32_t slot = t0 & (b.shape.page_tokens - 1);
      const uint8_t* codes = it.code_pages[page] + size_t{kvh} * M * b.shape.page_tokens + slot;
      for (uint32_t m = 0; m < M; ++m)
        cp_async4(codes_s + m * kScoreThreads, codes + size_t{m} * b.shape.page_tokens);
    }
    cp_async_commit();
  };
  // The first pass's code words are requested while the lookup-table kernel still
  // runs (it releases this grid early, and no decode stage writes codes).
  stage_codes(tile0);
  stage_begin();
  const float* lut = ws.lut + size_t{row0} * M * K;
  const uint32_t n_lut = GH * M * K;
  if (n_lut % 4 == 0) {
    for (uint32_t i = threadIdx.x; i < n_lut / 4; i += kScoreThreads)
      smem4[i] = reinterpret_cast<const float4*>(lut)[i];
  } else {
    for (uint32_t i = threadIdx.x; i < n_lut; i += kScoreThreads) lut_s[i] = lut[i];
  }
  for (uint32_t i = threadIdx.x; i < GH * kScoreBins; i += kScoreThreads) hist_s[i] = 0u;
  if (threadIdx.x < GH) {
    smax[threadIdx.x] = 0u;
    smin[threadIdx.x] = 0xffffffffu;
    bins_s[threadIdx.x] = pq_score_bins(ws.lut_range + size_t{row0 + threadIdx.x} * M * 2, M);
    if (blockIdx.x == 0) bins_s[threadIdx.x].store(ws.rows[row0 + threadIdx.x]);
  }
  cp_async_wait<0>();
  __syncthreads();
  ScoreBins bins[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) bins[g] = bins_s[g];

  uint32_t local_max[GH], local_min[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    local_max[g] = 0u;
    local_min[g] = 0xffffffffu;
  }
  for (uint32_t sub0 = tile0; sub0 < tile_end; sub0 += kSubTile) {
    if (sub0 != tile0) stage_codes(sub0);
    cp_async_wait<0>();
    const uint32_t t0 = sub0 + threadIdx.x * kTokensPerThread;
    if (t0 >= tile_end) break;
    float acc[GH][kTokensPerThread];
#pragma unroll
    for (int g = 0; g < GH; ++g)
#pragma unroll
      for (int j = 0; j < kTokensPerThread; ++j) acc[g][j] = 0.f;
    uint32_t m = m_first;
    if constexpr (kM16) {
      // Eight subspaces' lookups unrolled: enough independent loads in flight to
      // hide the shared-memory latency without the registers of sixteen.
#pragma unroll 8
      for (uint32_t step = 0; step < 16; ++step) {
        const uint32_t cw = codes_s[m * kScoreThreads];
        const char* m_base = reinterpret_cast<const char*>(lut_s) + m * 16;
#pragma unroll
        for (int j = 0; j < kTokensPerThread; ++j) {
          float v[GH];
          lut_entries_m16<GH>(m_base, cw, j, v);
#pragma unroll
          for (int g = 0; g < GH; ++g) acc[g][j] += v[g];
        }
        m = (m + 1) & 15u;
      }
    } else {
#pragma unroll 2
      for (uint32_t step = 0; step < M; ++step) {
        const uint32_t cw = codes_s[m * kScoreThreads];
#pragma unroll
        for (int j = 0; j < kTokensPerThread; ++j) {
          float v[GH];
          lut_entries<GH>(lut_s, m, (cw >> (8 * j)) & 0xffu, M, K, v);
#pragma unroll
          for (int g = 0; g < GH; ++g) acc[g][j] += v[g];
        }
        m = m + 1 == M ? 0 : m + 1;
      }
    }
    // Masked positions (sink, local, the padding past the last token) get -inf;
    // one float4 store per row (t0 and each row's base are multiples of 4).
#pragma unroll
    for (int g = 0; g < GH; ++g) {
      float s[kTokensPerThread];
#pragma unroll
      for (int j = 0; j < kTokensPerThread; ++j) {
        const uint32_t t = t0 + j;
        const bool cand = t >= it.sink_end && t < it.local_begin;
        s[j] = cand ? acc[g][j] : -INFINITY;
        if (cand) {
          local_max[g] = max(local_max[g], float_key(s[j]));
          local_min[g] = min(local_min[g], float_key(s[j]));
          atomicAdd(&hist_s[g * kScoreBins + bins[g].bin(s[j])], 1u);
        }
      }
      float* out = ws.scores + it.score_base + static_cast<size_t>(h0 + g) * it.n_pad + t0;
      *reinterpret_cast<float4*>(out) = make_float4(s[0], s[1], s[2], s[3]);
    }
  }
  cp_async_wait<0>();
  flush_block_stats<GH>(local_max, local_min, smax, smin, hist_s, ws, row0);
}

// 4-bit codes (SSA_PROXY_PQ4, _OPQ4, _QPQ4), scored as the CPU backend scores
// them (lib/decode/quantized_lut.h): each row's float tables (bit for bit the
// CPU's) quantised to bytes, lo_m = min_c, span = max_m (max_c - lo_m), entries
// round((lut - lo_m) * 255 / span) in double, then a token's score is
// fmaf(span / 255, sum_m byte[m][code_m], sum_m lo_m) with an exact integer sum:
// the CPU's scores to the bit, so the same selection. Each block quantises its
// rows' tables itself (512 entries a head: less than loading them). The byte
// tables of four heads share one 32-bit word per (code, subspace), laid out
// [code][subspace] as the float tables are. The word's even and odd bytes are
// added in two 16-bit lanes each (sums of at most 256 x 510 < 2^16), four heads
// per lookup.
//
// kPairs: the block then adds each code byte's two entries into a table per byte
// position (pq4_pair_bytes), and a token's score takes one 8-byte lookup per
// byte: about 5 instructions per byte where the nibbles' lookups take about 18
// (two nibbles, their rotated subspaces, two lookups, four masks). Lanes walk
// the byte positions in rotated order, so a half-warp's lookups hit 32 banks.
// Without it (tables too large for shared memory) each nibble is looked up: a
// lane's lookups at a step fall in the bank of its subspace, the upper half of a
// warp taking each byte's odd subspace first, so a warp's 32 lookups hit 32 banks.
template <int GH, bool kPairs>
__global__ void __launch_bounds__(kScoreThreads, GH >= 8 ? 1 : kScoreBlocksPerSm) pq4_score_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
                                                                uint32_t tile) {
  constexpr int P = (GH + 3) / 4;  // planes of four heads
  extern __shared__ float4 smem4[];
  const uint32_t M = b.shape.pq_subspaces, K = b.shape.pq_centroids, R = M / 2;
  const uint32_t RS = pq4_pair_stride(b.shape);
  uint2* pairs = reinterpret_cast<uint2*>(smem4);  // [P][256][RS] (kPairs), then the rest
  uint32_t* t8 = reinterpret_cast<uint32_t*>(pairs + (kPairs ? size_t{P} * 256 * RS : 0));  // [P][16][M]
  uint32_t* codes_s = t8 + size_t{P} * 16 * M + threadIdx.x;  // [R][threads]
  float* lo_s = reinterpret_cast<float*>(t8 + size_t{P} * 16 * M + size_t{R} * kScoreThreads);  // [GH][M]
  float* hi_s = lo_s + GH * M;  // [GH][M]
  uint32_t* hist_s = reinterpret_cast<uint32_t*>(hi_s + GH * M);  // [GH][bins]
  __shared__ uint32_t smax[GH], smin[GH];
  __shared__ ScoreBins bins_s[GH];
  __shared__ float scale_s[GH], bias_s[GH];
  __shared__ double inv_s[GH];
  const uint32_t item = blockIdx.z;
  const DecodeItem& it = b.item(item);
  const uint32_t tile0 = blockIdx.x * tile;
  if (!item_selects(it) || tile0 >= it.n_tokens) return;
  const uint32_t G = b.sel_group();
  const uint32_t chunks = G / GH;
  const uint32_t kvh = blockIdx.y / chunks;
  const uint32_t h0 = kvh * G + (blockIdx.y % chunks) * GH;
  const uint32_t row0 = row_of(item, h0, b.sel_heads());
  const uint32_t tile_end = min(it.n_tokens, tile0 + tile);
  auto stage_codes = [&](uint32_t sub0) {
    const uint32_t t0 = sub0 + threadIdx.x * kTokensPerThread;
    if (t0 < tile_end) {
      const uint32_t page = t0 >> b.shape.page_shift;
      const uint32_t slot = t0 & (b.shape.page_tokens - 1);
      const uint8_t* codes = it.code_pages[page] + size_t{kvh} * R * b.shape.page_tokens + slot;
      for (uint32_t r = 0; r < R; ++r)
        cp_async4(codes_s + r * kScoreThreads, codes + size_t{r} * b.shape.page_tokens);
    }
    cp_async_commit();
  };
  stage_codes(tile0);
  stage_begin();
  const float* lut = ws.lut + size_t{row0} * M * K;
  for (uint32_t i = threadIdx.x; i < GH * M; i += kScoreThreads) {
    const uint32_t g = i / M, m = i % M;
    float lo = INFINITY, hi = -INFINITY;
    for (uint32_t c = 0; c < K; ++c) {
      const float v = lut[lut_offset<GH>(g, m, c, M, K)];
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    lo_s[i] = lo;
    hi_s[i] = hi;
  }
  for (uint32_t i = threadIdx.x; i < P * 16 * M; i += kScoreThreads) t8[i] = 0u;
  for (uint32_t i = threadIdx.x; i < GH * kScoreBins; i += kScoreThreads) hist_s[i] = 0u;
  __syncthreads();
  if (threadIdx.x < GH) {
    const uint32_t g = threadIdx.x;
    // In m order, as quantize_lut sums them.
    double bias = 0.0, span = 0.0;
    for (uint32_t m = 0; m < M; ++m) {
      bias += lo_s[g * M + m];
      span = fmax(span, static_cast<double>(hi_s[g * M + m]) - static_cast<double>(lo_s[g * M + m]));
    }
    const bool spread = span > 0.0 && isfinite(span);
    bias_s[g] = static_cast<float>(bias);
    scale_s[g] = spread ? static_cast<float>(span / 255.0) : 0.0f;
    inv_s[g] = spread ? 255.0 / span : 0.0;
    smax[g] = 0u;
    smin[g] = 0xffffffffu;
    bins_s[g] = pq_score_bins(ws.lut_range + size_t{row0 + g} * M * 2, M);
    if (blockIdx.x == 0) bins_s[g].store(ws.rows[row0 + g]);
  }
  __syncthreads();
  uint8_t* t8b = reinterpret_cast<uint8_t*>(t8);
  for (uint32_t i = threadIdx.x; i < GH * M * K; i += kScoreThreads) {
    const uint32_t g = i / (M * K), m = i / K % M, c = i % K;
    if (inv_s[g] == 0.0) continue;  // no spread: every entry 0, every score the bias
    const double lo = lo_s[g * M + m];
    const double v = floor((static_cast<double>(lut[lut_offset<GH>(g, m, c, M, K)]) - lo) * inv_s[g] + 0.5);
    t8b[((size_t{g / 4} * 16 + c) * M + m) * 4 + g % 4] = static_cast<uint8_t>(fmin(255.0, fmax(0.0, v)));
  }
  if constexpr (kPairs) {
    __syncthreads();
    // Entry (p, byte c, position r): the low nibble's entry of subspace 2r plus the
    // high nibble's of 2r + 1, four heads in two words of 16-bit lanes.
    for (uint32_t i = threadIdx.x; i < P * 256 * R; i += kScoreThreads) {
      const uint32_t p = i / (256 * R), c = i / R % 256, r = i % R;
      const uint32_t wa = t8[(p * 16 + (c & 15u)) * M + 2 * r], wb = t8[(p * 16 + (c >> 4)) * M + 2 * r + 1];
      pairs[(size_t{p} * 256 + c) * RS + r] =
          make_uint2((wa & 0x00ff00ffu) + (wb & 0x00ff00ffu), ((wa >> 8) & 0x00ff00ffu) + ((wb >> 8) & 0x00ff00ffu));
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  ScoreBins bins[GH];
  float scale[GH], bias[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    bins[g] = bins_s[g];
    scale[g] = scale_s[g];
    bias[g] = bias_s[g];
  }
  uint32_t local_max[GH], local_min[GH];
#pragma unroll
  for (int g = 0; g < GH; ++g) {
    local_max[g] = 0u;
    local_min[g] = 0xffffffffu;
  }
  const uint32_t lane = threadIdx.x & 31, r_first = lane % R, odd_first = (lane / R) & 1u;
  for (uint32_t sub0 = tile0; sub0 < tile_end; sub0 += kSubTile) {
    if (sub0 != tile0) stage_codes(sub0);
    cp_async_wait<0>();
    const uint32_t t0 = sub0 + threadIdx.x * kTokensPerThread;
    if (t0 >= tile_end) break;
    uint32_t even[P][kTokensPerThread], odd[P][kTokensPerThread];  // 16-bit lanes: heads 4p, 4p+2 / 4p+1, 4p+3
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int j = 0; j < kTokensPerThread; ++j) even[p][j] = odd[p][j] = 0u;
    uint32_t r = r_first;
    if constexpr (kPairs) {
#pragma unroll 2
      for (uint32_t step = 0; step < R; ++step) {
        const uint32_t cw = codes_s[r * kScoreThreads];
        const uint2* row = pairs + r;
#pragma unroll
        for (int j = 0; j < kTokensPerThread; ++j) {
          const uint32_t c = __byte_perm(cw, 0u, 0x4440u | static_cast<uint32_t>(j));  // byte j of cw
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const uint2 v = row[(p * 256u + c) * RS];
            even[p][j] += v.x;
            odd[p][j] += v.y;
          }
        }
        r = r + 1 == R ? 0 : r + 1;
      }
    } else {
#pragma unroll 2
      for (uint32_t step = 0; step < R; ++step) {
        const uint32_t cw = codes_s[r * kScoreThreads];
        const uint32_t ma = 2 * r + odd_first, mb = 2 * r + 1 - odd_first;
#pragma unroll
        for (int j = 0; j < kTokensPerThread; ++j) {
          const uint32_t byte = (cw >> (8 * j)) & 0xffu;
          const uint32_t ca = odd_first ? byte >> 4 : byte & 0x0fu, cb = odd_first ? byte & 0x0fu : byte >> 4;
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const uint32_t wa = t8[(p * 16 + ca) * M + ma], wb = t8[(p * 16 + cb) * M + mb];
            even[p][j] += (wa & 0x00ff00ffu) + (wb & 0x00ff00ffu);
            odd[p][j] += ((wa >> 8) & 0x00ff00ffu) + ((wb >> 8) & 0x00ff00ffu);
          }
        }
        r = r + 1 == R ? 0 : r + 1;
      }
    }
#pragma unroll
    for (int g = 0; g < GH; ++g) {
      float s[kTokensPerThread];
#pragma unroll
      for (int j = 0; j < kTokensPerThread; ++j) {
        const uint32_t w = g % 2 == 0 ? even[g / 4][j] : odd[g / 4][j];
        const uint32_t sum = (g % 4 < 2 ? w : w >> 16) & 0xffffu;
        const uint32_t t = t0 + j;
        const bool cand = t >= it.sink_end && t < it.local_begin;
        s[j] = cand ? fmaf(scale[g], static_cast<float>(sum), bias[g]) : -INFINITY;
        if (cand) {
          local_max[g] = max(local_max[g], float_key(s[j]));
          local_min[g] = min(local_min[g], float_key(s[j]));
          atomicAdd(&hist_s[g * kScoreBins + bins[g].bin(s[j])], 1u);
        }
      }
      float* out = ws.scores + it.score_base + static_cast<size_t>(h0 + g) * it.n_pad + t0;
      *reinterpret_cast<float4*>(out) = make_float4(s[0], s[1], s[2], s[3]);
    }
  }
  cp_async_wait<0>();
  flush_block_stats<GH>(local_max, local_min, smax, smin, hist_s, ws, row0);
}

// Exact scores for all q heads of one KV head; groups of TPR lanes take tokens.
template <int D, typename T>
__global__ void __launch_bounds__(128) exact_score_kernel(const __grid_constant__ DecodeBatch b, Workspace ws) {
  stage_begin();
  using RS = RowSplit<D>;
  constexpr int kGroups = 128 / RS::kTpr;
  constexpr int kTile = 256;
  extern __shared__ float qs[];  // [G][D]
  uint32_t* smax = reinterpret_cast<uint32_t*>(qs + b.sel_group() * D);
  uint32_t* smin = smax + b.sel_group();
  const uint32_t item = blockIdx.z;
  const DecodeItem& it = b.item(item);
  const uint32_t tile0 = blockIdx.x * kTile;
  if (!item_selects(it) || tile0 >= it.n_tokens) return;
  const uint32_t G = b.sel_group();  // selection heads per KV head
  const uint32_t kvh = blockIdx.y;
  const uint32_t h0 = kvh * G;  // first selection head
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  if (b.grouped()) {
    // The group's mean query, as the CPU's mean_query (see build_lut_kernel).
    const uint32_t GQ = b.shape.group();
    const T* q = static_cast<const T*>(it.q) + size_t{kvh} * GQ * D;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) {
      float s = 0.f;
      for (uint32_t g = 0; g < GQ; ++g) s = __fadd_rn(s, __fmul_rn(Elem<T>::load(q + size_t{g} * D + i), scale));
      qs[i] = __fdiv_rn(s, static_cast<float>(GQ));
    }
  } else {
    const T* q = static_cast<const T*>(it.q) + size_t{h0} * D;
    for (uint32_t i = threadIdx.x; i < G * D; i += blockDim.x) qs[i] = Elem<T>::load(q + i) * scale;
  }
  for (uint32_t i = threadIdx.x; i < G; i += blockDim.x) {
    smax[i] = 0u;
    smin[i] = 0xffffffffu;
  }
  __syncthreads();
  const int lane = threadIdx.x % RS::kTpr, grp = threadIdx.x / RS::kTpr;
  const uint32_t end = min(it.n_tokens, tile0 + kTile);
  // Uniform trip count across each warp (shuffles below); t may run past end.
  for (uint32_t tb = tile0; tb < end; tb += kGroups) {
    const uint32_t t = tb + grp;
    const bool in = t < end;
    float kv[RS::kEpt];
    if (in) {
      const uint32_t page = t >> b.shape.page_shift, slot = t & (b.shape.page_tokens - 1);
      const T* k = reinterpret_cast<const T*>(it.kv_pages[page]) +
                   (size_t{kvh} * b.shape.page_tokens + slot) * D + lane * RS::kEpt;
#pragma unroll
      for (int e = 0; e < RS::kEpt; e += 8) load8(k + e, kv + e);
    } else {
#pragma unroll
      for (int e = 0; e < RS::kEpt; ++e) kv[e] = 0.f;
    }
    const bool cand = t >= it.sink_end && t < it.local_begin;
    for (uint32_t g = 0; g < G; ++g) {
      const float* qg = qs + g * D + lane * RS::kEpt;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < RS::kEpt; ++e) dot = fmaf(kv[e], qg[e], dot);
#pragma unroll
      for (int o = RS::kTpr / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0 && in) {
        const float s = cand ? dot : -INFINITY;
        ws.scores[it.score_base + size_t{h0 + g} * it.n_pad + t] = s;
        if (cand) {
          atomicMax(&smax[g], float_key(s));
          atomicMin(&smin[g], float_key(s));
        }
      }
    }
  }
  __syncthreads();
  for (uint32_t g = threadIdx.x; g < G; g += blockDim.x) {
    if (smax[g] == 0u) continue;
    RowState& st = ws.rows[row_of(item, h0 + g, b.sel_heads())];
    atomicMax(&st.max_key, smax[g]);
    atomicMin(&st.min_key, smin[g]);
  }
}

// Selection heads scored per pass: a divisor of the selection heads per KV head
// (`group`: the GQA group per head, 1 with group selection).
int heads_per_pass(const DecodeShape& s, uint32_t group) {
  for (int gh : {8, 4, 2, 1}) {
    if (group % gh == 0 && score_smem_bytes(gh, s) <= kScoreSmemLimit) return gh;
  }
  return 0;
}

template <int GH, bool kM16>
cudaError_t launch_pq_score_kernel(const DecodeBatch& b, const WorkspacePlan& plan,
                                   const Workspace& ws, cudaStream_t st) {
  const size_t smem = score_smem_bytes(GH, b.shape);
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(pq_score_kernel<GH, kM16>), smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((plan.n_pad_max + plan.score_tile - 1) / plan.score_tile,
                  b.shape.n_kv_heads * (b.sel_group() / GH), b.n_items);
  return launch_stage(b, pq_score_kernel<GH, kM16>, grid, kScoreThreads, smem, st, b, ws, plan.score_tile);
}

template <int GH, bool kPairs>
cudaError_t launch_pq4_score_kernel(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                    cudaStream_t st) {
  const size_t smem = score_smem_bytes(GH, b.shape);
  cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(pq4_score_kernel<GH, kPairs>), smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((plan.n_pad_max + plan.score_tile - 1) / plan.score_tile,
                  b.shape.n_kv_heads * (b.sel_group() / GH), b.n_items);
  return launch_stage(b, pq4_score_kernel<GH, kPairs>, grid, kScoreThreads, smem, st, b, ws, plan.score_tile);
}

template <int GH>
cudaError_t launch_pq_score_gh(const DecodeBatch& b, const WorkspacePlan& plan,
                               const Workspace& ws, cudaStream_t st) {
  if (b.shape.pq_code_bits == 4) {
    return pq4_pairs(GH, b.shape) ? launch_pq4_score_kernel<GH, true>(b, plan, ws, st)
                                  : launch_pq4_score_kernel<GH, false>(b, plan, ws, st);
  }
  if constexpr (LutVec<GH>::W == 4) {
    if (b.shape.pq_subspaces == 16 && b.shape.pq_centroids == 256)
      return launch_pq_score_kernel<GH, true>(b, plan, ws, st);
  }
  return launch_pq_score_kernel<GH, false>(b, plan, ws, st);
}

}  // namespace

const char* pq_shape_unsupported(const DecodeShape& s) {
  if (s.pq_code_bits == 4 && (s.pq_centroids > 16 || s.pq_subspaces % 2 != 0 || s.pq_subspaces > 256))
    return "4-bit codes need at most 16 centroids and an even number of at most 256 subspaces";
  if (heads_per_pass(s, s.group()) == 0) return "the PQ lookup table of one head exceeds shared memory";
  if (s.page_tokens < 16) return "pages of fewer than 16 tokens";
  return nullptr;
}

cudaError_t launch_pq_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st) {
  cudaError_t e = cudaSuccess;
  const uint32_t lut_threads = min(b.shape.pq_centroids, 256u);
  auto run = [&](auto gh) {
    constexpr int GH = decltype(gh)::value;
    const dim3 lut_grid(b.shape.pq_subspaces, b.sel_heads() / GH, b.n_items);
    // Room for whole queries too: an item may carry a query transform.
    const size_t qsmem = size_t{GH} * (b.shape.head_dim / b.shape.pq_subspaces + b.shape.head_dim) * sizeof(float);
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      e = launch_stage(b, build_lut_kernel<T, GH>, lut_grid, lut_threads, qsmem, st, b, ws);
    });
    if (e == cudaSuccess) e = launch_pq_score_gh<GH>(b, plan, ws, st);
  };
  switch (heads_per_pass(b.shape, b.sel_group())) {
    case 8: run(std::integral_constant<int, 8>{}); break;
    case 4: run(std::integral_constant<int, 4>{}); break;
    case 2: run(std::integral_constant<int, 2>{}); break;
    case 1: run(std::integral_constant<int, 1>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return e;
}

cudaError_t launch_exact_scores(const DecodeBatch& b, const WorkspacePlan& plan,
                                const Workspace& ws, cudaStream_t st) {
  cudaError_t e = cudaErrorInvalidValue;
  const size_t smem = size_t{b.sel_group()} * (b.shape.head_dim + 2) * sizeof(float);
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      e = ensure_dynamic_smem(reinterpret_cast<const void*>(exact_score_kernel<D, T>), smem);
      if (e != cudaSuccess) return;
      const dim3 grid((plan.n_pad_max + 255) / 256, b.shape.n_kv_heads, b.n_items);
      e = launch_stage(b, exact_score_kernel<D, T>, grid, 128, smem, st, b, ws);
    });
  });
  return e;
}

}  // namespace ssa::cuda
