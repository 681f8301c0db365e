// One KV group's attention on tensor cores, the parts its two kernels share
// (dense_attention_mma.cu over a split's tokens, group_attention.cu over the
// group's read set): the q fragments, a 16-row tile's logits, the online-softmax
// update, the V accumulation, and the block's epilogue that merges its warps by
// log-sum-exp into the split partials. The kernels differ in how rows reach the
// shared-memory ring (and the group kernel's log pi bias); these functions start
// from a tile in the ring.
//
// Products are transposed (rows as the MMA's M, the group's q heads as N = 8):
// S^T = K Q^T, O^T += V^T P^T. Every thread holds the same two heads (2 t4,
// 2 t4 + 1 of its head tile) in S^T and in O^T, so the rescale moves no data.
// Logits are in base 2; m is written in natural-log units as the merge expects.
// Fragment layouts: mma_fragments.cuh.
#pragma once

#include <stdint.h>

#include "cp_async.cuh"
#include "device_util.cuh"
#include "mma_fragments.cuh"

namespace ssa::cuda::mma {

// q^T as B fragments: head ht * 8 + g of the group (q_group: its first head),
// dims kk * 16 + 2 t4 + {0, 1, 8, 9}; heads past G are zero (their results are
// never stored). q is used unscaled (exact in T); the scale is applied in f32.
template <int D, typename T>
__device__ __forceinline__ void load_q_fragments(const T* q_group, uint32_t G, int ht, int g, int t4,
                                                 uint32_t (&qf)[D / 16][2]) {
  const uint32_t head = ht * 8 + g;
  const T* q = q_group + size_t{head} * D + 2 * t4;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = head < G ? *reinterpret_cast<const uint32_t*>(q + kk * 16) : 0u;
    qf[kk][1] = head < G ? *reinterpret_cast<const uint32_t*>(q + kk * 16 + 8) : 0u;
  }
}

// s = the raw q.k of rows (g, g, g + 8, g + 8) and heads (2 t4, 2 t4 + 1, ...) of
// the warp's 16 rows at ks (pitch kP elements): S^T = K Q^T, with two
// accumulators to halve the dependent chain.
template <int D, int kP, typename T>
__device__ __forceinline__ void tile_logits(const T* ks, int lane, const uint32_t (&qf)[D / 16][2],
                                            float (&s)[4]) {
  float sa[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f};
  // ldmatrix x4 lane address: matrix lane / 8 = (rows +8 if odd, cols +8 if >= 2).
  const T* kr = ks + (lane % 16) * kP + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, kr + kk * 16);
    mma16816<T>((kk & 1) ? sb : sa, a, qf[kk][0], qf[kk][1]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) s[j] = sa[j] + sb[j];
}

// The online-softmax step of one tile per head (column): the max over its 16
// rows (over g: lane bits 2-4), the rescale of l and o, and p = the tile's
// weights in the new scale. s: base-2 logits, -inf for rows that do not count.
template <int D>
__device__ __forceinline__ void online_softmax_tile(const float (&s)[4], float (&m)[2], float (&l)[2],
                                                    float (&o)[D / 16][4], float (&p)[4]) {
  float corr[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float mx = fmaxf(s[j], s[j + 2]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m[j], mx);
    // Nothing finite seen yet: subtract 0, so exp2(-inf) = 0 and never inf - inf.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    corr[j] = exp2_approx(m[j] - m_use);
    p[j] = exp2_approx(s[j] - m_use);
    p[j + 2] = exp2_approx(s[j + 2] - m_use);
    l[j] = l[j] * corr[j] + p[j] + p[j + 2];
    m[j] = m_new;
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    o[mt][0] *= corr[0];
    o[mt][1] *= corr[1];
    o[mt][2] *= corr[0];
    o[mt][3] *= corr[1];
  }
}

// O^T (D x 8 heads) += V^T P^T over the warp's 16 rows at vs (pitch kP).
template <int D, int kP, typename T>
__device__ __forceinline__ void accumulate_pv(const T* vs, int lane, const float (&p)[4], float (&o)[D / 16][4]) {
  // P^T: (rows g, g + 8) x (heads 2 t4, 2 t4 + 1) is the 8x8 fragment layout of
  // [row][head]; transposed it is (head g) x (rows 2 t4, 2 t4 + 1) = B operand.
  const uint32_t pb0 = movmatrix_trans(pack2<T>(p[0], p[1]));
  const uint32_t pb1 = movmatrix_trans(pack2<T>(p[2], p[3]));
  // V^T tiles by ldmatrix.trans of the [row][dim] tile: matrix lane / 8 = (dims
  // +8 if odd, rows +8 if >= 2).
  const T* vr = vs + ((lane % 8) + (lane / 16) * 8) * kP + ((lane / 8) & 1) * 8;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, vr + mt * 16);
    mma16816<T>(o[mt], a, pb0, pb1);
  }
}

// The block's epilogue: every warp's (m, l, O^T) through shared memory (smem,
// free once the ring's copies have landed: waited for here), the warps of each
// head tile merged by log-sum-exp, and each of the G heads' [m, l, acc[D]]
// written to its split partial. Warp w = token group * kHeadTiles + head tile;
// kOP: the merge area's row pitch in floats.
template <int D, int kTokenGroups, int kHeadTiles, int kOP>
__device__ __forceinline__ void write_group_partials(uint8_t* smem, int warp, int g, int t4, float (&m)[2],
                                                     float (&l)[2], const float (&o)[D / 16][4], uint32_t G,
                                                     uint32_t item, uint32_t kvh, uint32_t n_q_heads,
                                                     uint32_t n_splits, uint32_t split, float* partial) {
  constexpr int kWarps = kTokenGroups * kHeadTiles, kThreads = kWarps * 32;
  // Sum of this warp's weights per head: the 8 lanes of each t4.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 4);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 8);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 16);
  }
  cp_async_wait<0>();
  __syncthreads();
  float* obuf = reinterpret_cast<float*>(smem);  // [warp][8 heads][kOP]
  float* mlbuf = obuf + kWarps * 8 * kOP;        // [warp][8 heads][m, l]
  {
    float* ow = obuf + warp * 8 * kOP;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      const int d = mt * 16 + g;
      ow[(2 * t4) * kOP + d] = o[mt][0];
      ow[(2 * t4 + 1) * kOP + d] = o[mt][1];
      ow[(2 * t4) * kOP + d + 8] = o[mt][2];
      ow[(2 * t4 + 1) * kOP + d + 8] = o[mt][3];
    }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mlbuf[(warp * 8 + 2 * t4 + j) * 2] = m[j];
        mlbuf[(warp * 8 + 2 * t4 + j) * 2 + 1] = l[j];
      }
    }
  }
  __syncthreads();
  constexpr float kLn2 = 0.6931471805599453f;
  for (uint32_t x = threadIdx.x; x < G * D; x += kThreads) {
    const uint32_t h = x / D, d = x % D;
    const int h_tile = h / 8, hh = h % 8;
    float M = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTokenGroups; ++j) M = fmaxf(M, mlbuf[((j * kHeadTiles + h_tile) * 8 + hh) * 2]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int j = 0; j < kTokenGroups; ++j) {
        const int w = j * kHeadTiles + h_tile;
        const float mw = mlbuf[(w * 8 + hh) * 2];
        if (mw == -INFINITY) continue;
        const float f = exp2_approx(mw - M);
        L += mlbuf[(w * 8 + hh) * 2 + 1] * f;
        A += obuf[(w * 8 + hh) * kOP + d] * f;
      }
    }
    const uint32_t row = row_of(item, kvh * G + h, n_q_heads);
    float* out = partial + (size_t{row} * n_splits + split) * (D + 2);
    if (d == 0) {
      out[0] = M * kLn2;  // -inf stays -inf
      out[1] = L;
    }
    out[2 + d] = A;
  }
}

}  // namespace ssa::cuda::mma
