// The error estimate of one error-targeted decode round: per q head, the
// relative variance per draw V of the self-normalised estimate from the rows the
// round read, by the formula of lib/select/error_target.cc (DrawMoments):
//   exact rows E (sink, local, heavy list): z_E = sum e^s, y_E = sum e^s v;
//   the m draws i_j from the residual with proposal probability p_j (the
//   sampler's fixed-point weight over the row's total, so exactly what drew
//   them), x_j = e^{s_j} / p_j: s0 = sum x, q0 = sum x^2, q2 = sum x^2 ||v||^2,
//   s1 = sum x v, q1 = sum x^2 v (every draw with its multiplicity);
//   Z = z_E + s0 / m, o = (y_E + s1 / m) / Z,
//   S^2 = (sum_j ||x_j (v_j - o)||^2 - m ||u_bar||^2) / (m - 1), u_bar = (s1 - o s0) / m,
//   V = S^2 / (Z^2 ||o||^2).
// Sums in double, shifted by the largest logit seen (rescaled as it grows).
// Two kernels: one warp per (split of the row's read positions, q head, item)
// sums its positions in order into a partial; one block per row merges the
// partials in split order and finishes V. Nothing depends on timing, so V is a
// function of the round's inputs.
#include <math.h>

#include <algorithm>

#include "device_util.cuh"
#include "error_estimate.h"
#include "head_dim.cuh"

namespace ssa::cuda {
namespace {

// A partial: [m_E, z_E, M_D, s0, q0, q2, -, -] then y_E[D], s1[D], q1[D].
constexpr uint32_t kHeader = 8;
constexpr uint32_t kMaxEstimateSplits = 256;
constexpr uint32_t kPositionsPerSplit = 64;
constexpr int kFinishThreads = 256;

__host__ __device__ inline size_t partial_doubles(uint32_t d) { return kHeader + 3 * size_t{d}; }

__device__ inline bool sparse_item(const DecodeItem& it) { return item_selects(it); }

// Draws with a usable token list: the sampler draws nothing from a row whose
// residual weight is 0 (every residual weight below 2^-39 of the largest).
__device__ inline uint32_t listed_draws(const RowState& st) { return st.w_total > 0.0 ? st.n_draws : 0u; }

__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int E, typename T>
__device__ __forceinline__ void load_lane(const T* p, float* out) {
  if constexpr (E >= 8) {
#pragma unroll
    for (int e = 0; e < E; e += 8) load8(p + e, out + e);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = Elem<T>::load(p + e);
  }
}

template <int D, typename T>
__global__ void __launch_bounds__(32) estimate_split_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, double* part,
                                                            uint32_t n_splits) {
  constexpr int E = D / 32;  // elements per lane
  constexpr int kUnroll = E >= 16 ? 2 : 4;
  const uint32_t item = blockIdx.z, h = blockIdx.y, split = blockIdx.x, lane = threadIdx.x;
  const DecodeItem& it = b.item(item);
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  double* out = part + (size_t{row} * n_splits + split) * partial_doubles(D);
  double mE = -INFINITY, zE = 0.0, MD = -INFINITY, s0 = 0.0, q0 = 0.0, q2 = 0.0;
  double yE[E], s1[E], q1[E];
#pragma unroll
  for (int e = 0; e < E; ++e) yE[e] = s1[e] = q1[e] = 0.0;
  if (sparse_item(it)) {
    const RowState& st = ws.rows[row];
    const uint32_t n_sink = it.sink_end, n_local = it.n_tokens - it.local_begin;
    const uint32_t n_fixed = n_sink + n_local, n_exact = n_fixed + st.n_heavy;
    const uint32_t P = n_exact + listed_draws(st);
    uint32_t p0, p1;
    split_range(P, n_splits, split, &p0, &p1);
    const size_t sel = it.select_base + size_t{h} * it.select_cap;
    const float* scores = ws.scores + row_token_base(it, h);
    const float mx = key_float(st.max_key);
    const uint32_t kvh = h / b.shape.group();
    const uint32_t page_mask = b.shape.page_tokens - 1;
    const size_t v_off = size_t{b.shape.page_tokens} * b.shape.n_kv_heads * D;
    const float scale = 1.0f / sqrtf(static_cast<float>(D));
    float q[E];
    load_lane<E>(static_cast<const T*>(it.q) + size_t{h} * D + lane * E, q);
#pragma unroll
    for (int e = 0; e < E; ++e) q[e] *= scale;
    auto token_at = [&](uint32_t p) -> uint32_t {
      if (p < n_sink) return p;
      if (p < n_fixed) return it.local_begin + (p - n_sink);
      if (p < n_exact) return ws.heavy[sel + (p - n_fixed)];
      return ws.draw_tokens[sel + (p - n_exact)];
    };
    for (uint32_t pb = p0; pb < p1; pb += kUnroll) {
      float kr[kUnroll][E], vr[kUnroll][E];
      uint32_t tok[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t p = pb + u;
        tok[u] = p < p1 ? token_at(p) : 0u;
        if (p < p1) {
          const uint32_t t = tok[u];
          const T* kp = reinterpret_cast<const T*>(it.kv_pages[t >> b.shape.page_shift]) +
                        (size_t{kvh} * b.shape.page_tokens + (t & page_mask)) * D + lane * E;
          load_lane<E>(kp, kr[u]);
          load_lane<E>(kp + v_off, vr[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t p = pb + u;
        if (p >= p1) break;  // the same for every lane
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[e], kr[u][e], dot);
        const double logit = static_cast<double>(warp_sum_f(dot));
        if (p < n_exact) {  // ExactSum::add
          if (logit > mE) {
            const double f = mE == -INFINITY ? 0.0 : exp(mE - logit);
            zE *= f;
#pragma unroll
            for (int e = 0; e < E; ++e) yE[e] *= f;
            mE = logit;
          }
          const double w = exp(logit - mE);
          zE += w;
#pragma unroll
          for (int e = 0; e < E; ++e) yE[e] += w * vr[u][e];
        } else {  // DrawMoments::add
          const uint64_t fixed = cand_weight_unmasked(scores[tok[u]], mx).fixed;
          const double pr = static_cast<double>(fixed) / st.w_total;
          if (logit > MD) {
            const double f = MD == -INFINITY ? 0.0 : exp(MD - logit);
            s0 *= f;
            q0 *= f * f;
            q2 *= f * f;
#pragma unroll
            for (int e = 0; e < E; ++e) {
              s1[e] *= f;
              q1[e] *= f * f;
            }
            MD = logit;
          }
          const double x = exp(logit - MD) / pr;
          double vv = 0.0;
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const double v = vr[u][e];
            s1[e] += x * v;
            q1[e] += x * x * v;
            vv += v * v;
          }
          s0 += x;
          q0 += x * x;
          q2 += x * x * vv;  // this lane's share of ||v||^2
        }
      }
    }
  }
  q2 = warp_sum(q2);
  if (lane == 0) {
    out[0] = mE;
    out[1] = zE;
    out[2] = MD;
    out[3] = s0;
    out[4] = q0;
    out[5] = q2;
    out[6] = out[7] = 0.0;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t i = lane * E + e;
    out[kHeader + i] = yE[e];
    out[kHeader + D + i] = s1[e];
    out[kHeader + 2 * D + i] = q1[e];
  }
}

__device__ inline double shift(double m, double M) { return m == -INFINITY ? 0.0 : exp(m - M); }

// Block sum in a fixed tree (the same order every run).
__device__ double block_sum(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kFinishThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kFinishThreads) estimate_finish_kernel(const __grid_constant__ DecodeBatch b, Workspace ws,
                                                                         const double* part, uint32_t n_splits,
                                                                         double* V) {
  __shared__ double red[kFinishThreads];
  const uint32_t item = blockIdx.y, h = blockIdx.x;
  const DecodeItem& it = b.item(item);
  const uint32_t D = b.shape.head_dim;
  const uint32_t row = row_of(item, h, b.shape.n_q_heads);
  if (!sparse_item(it)) {  // read exactly: no error
    if (threadIdx.x == 0) V[row] = 0.0;
    return;
  }
  const RowState& st = ws.rows[row];
  const uint32_t m = listed_draws(st);
  if (m < 2) {
    // No residual weight to miss (0), or too few draws to estimate it (inf).
    const bool empty = st.w_resid_proxy == 0.0 || (st.n_draws > 0 && st.w_total == 0.0);
    if (threadIdx.x == 0) V[row] = empty ? 0.0 : INFINITY;
    return;
  }
  const size_t stride = partial_doubles(D);
  const double* rp = part + size_t{row} * n_splits * stride;
  double ME = -INFINITY, MD = -INFINITY;
  for (uint32_t s = 0; s < n_splits; ++s) {
    ME = fmax(ME, rp[s * stride + 0]);
    MD = fmax(MD, rp[s * stride + 2]);
  }
  double zE = 0.0, s0 = 0.0, q0 = 0.0, q2 = 0.0;
  for (uint32_t s = 0; s < n_splits; ++s) {
    const double* p = rp + s * stride;
    const double fe = shift(p[0], ME), fd = shift(p[2], MD);
    zE += p[1] * fe;
    s0 += p[3] * fd;
    q0 += p[4] * fd * fd;
    q2 += p[5] * fd * fd;
  }
  const double md = static_cast<double>(m);
  const double Mx = fmax(MD, ME);
  const double fx = exp(MD - Mx), fe = zE > 0.0 ? exp(ME - Mx) : 0.0;
  const double Z = zE * fe + s0 * fx / md;
  double oo = 0.0, oq1 = 0.0, ubar2 = 0.0;
  for (uint32_t i = threadIdx.x; i < D; i += kFinishThreads) {
    double y = 0.0, a1 = 0.0, b1 = 0.0;
    for (uint32_t s = 0; s < n_splits; ++s) {
      const double* p = rp + s * stride;
      const double fes = shift(p[0], ME), fds = shift(p[2], MD);
      y += p[kHeader + i] * fes;
      a1 += p[kHeader + D + i] * fds;
      b1 += p[kHeader + 2 * D + i] * fds * fds;
    }
    const double o = ((zE > 0.0 ? y * fe : 0.0) + a1 * fx / md) / Z;
    oo += o * o;
    oq1 += o * b1;
    const double u = (a1 - o * s0) / md;
    ubar2 += u * u;
  }
  oo = block_sum(oo, red);
  oq1 = block_sum(oq1, red);
  ubar2 = block_sum(ubar2, red);
  if (threadIdx.x != 0) return;
  if (!(oo > 0.0) || !(Z > 0.0)) {
    V[row] = INFINITY;
    return;
  }
  const double sum_u2 = (q2 - 2.0 * oq1 + oo * q0) * fx * fx;
  const double s2 = fmax(0.0, (sum_u2 - md * ubar2 * fx * fx) / (md - 1.0));
  V[row] = s2 / (Z * Z * oo);
}

uint32_t estimate_splits(const DecodeBatch& b, const WorkspacePlan& plan) {
  uint32_t fixed = 0;
  for (uint32_t i = 0; i < b.n_items; ++i) {
    const DecodeItem& it = b.items[i];
    fixed = std::max(fixed, it.sink_end + (it.n_tokens - it.local_begin));
  }
  const uint64_t positions = uint64_t{fixed} + plan.select_cap_max;
  return static_cast<uint32_t>(
      std::clamp<uint64_t>((positions + kPositionsPerSplit - 1) / kPositionsPerSplit, 1, kMaxEstimateSplits));
}

}  // namespace

size_t estimate_scratch_bytes(const DecodeBatch& b, const WorkspacePlan& plan) {
  return size_t{b.n_items} * b.shape.n_q_heads * estimate_splits(b, plan) * partial_doubles(b.shape.head_dim) *
         sizeof(double);
}

cudaError_t launch_error_estimate(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                  void* scratch, double* V, cudaStream_t st) {
  if (b.grouped() || !b.record_draws || b.sampling != Sampling::kProxy) return cudaErrorInvalidValue;
  const uint32_t S = estimate_splits(b, plan);
  double* part = static_cast<double*>(scratch);
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_head_dim(b.shape.head_dim, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    dispatch_dtype(b.shape.dtype, [&](auto t) {
      using T = decltype(t);
      estimate_split_kernel<D, T><<<dim3(S, b.shape.n_q_heads, b.n_items), 32, 0, st>>>(b, ws, part, S);
      e = cudaGetLastError();
    });
  });
  if (e != cudaSuccess) return e;
  estimate_finish_kernel<<<dim3(b.shape.n_q_heads, b.n_items), kFinishThreads, 0, st>>>(b, ws, part, S, V);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
