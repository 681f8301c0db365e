// An append's device K and V rows into the session's pages, with the NaN/Inf
// scan in the same pass: one launch where a copy per (page run, head) and a scan
// of each array took a dozen, each a few microseconds of launch and of device
// latency on the path of every one-token append.
//
// An element is NaN or infinite exactly when its exponent bits are all ones, so
// the scan compares bit patterns and never converts. Where the source array and
// the rows are 16-byte aligned, threads move 16-byte vectors; otherwise one
// element each. A thread reports the first bad element of each unit it moves;
// atomicMin keeps the lowest of all.
#include <stdint.h>

#include "append_rows.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxBlocks = 2048;

template <typename Bits, Bits kExponent>
__device__ __forceinline__ bool bad(Bits b) {
  return (b & kExponent) == kExponent;
}

struct Geometry {
  uint64_t row_units;   // units (vectors or elements) per head row
  uint64_t unit_bytes;
  uint32_t n_kv, page_tokens, first_slot;
  uint64_t row_bytes, half_page_bytes;  // one head row; K (or V) of a whole page

  // Destination of unit u of the source (token-major rows).
  __device__ __forceinline__ uint8_t* dst(const AppendPages& pages, bool is_v, uint64_t u) const {
    const uint64_t r = u / row_units, c = u % row_units;
    const uint64_t t = r / n_kv, h = r % n_kv;
    const uint64_t slot_abs = first_slot + t;
    const uint64_t page = slot_abs / page_tokens, slot = slot_abs % page_tokens;
    return pages.kv[page] + (is_v ? half_page_bytes : 0) + (h * page_tokens + slot) * row_bytes + c * unit_bytes;
  }
};

// blockIdx.y: 0 copies k, 1 copies v.
template <typename Bits, Bits kExponent>
__global__ void __launch_bounds__(kThreads) append_rows_kernel(const uint8_t* k, const uint8_t* v, uint64_t n_units,
                                                               Geometry g, const __grid_constant__ AppendPages pages,
                                                               bool vectors, uint64_t elem_base,
                                                               unsigned long long* first_bad, uint8_t** table) {
  const bool is_v = blockIdx.y == 1;
  if (table != nullptr && blockIdx.x == 0 && blockIdx.y == 0) {
    for (uint32_t i = threadIdx.x; i < 2 * pages.count; i += kThreads)
      table[i] = i < pages.count ? pages.kv[i] : pages.code[i - pages.count];
  }
  const uint8_t* src = is_v ? v : k;
  unsigned long long* first = first_bad != nullptr ? first_bad + blockIdx.y : nullptr;
  const uint64_t stride = uint64_t{gridDim.x} * kThreads;
  if (vectors) {
    constexpr uint32_t kPerVec = 16 / sizeof(Bits);
    for (uint64_t u = uint64_t{blockIdx.x} * kThreads + threadIdx.x; u < n_units; u += stride) {
      union {
        uint4 u4;
        Bits b[kPerVec];
      } w;
      w.u4 = reinterpret_cast<const uint4*>(src)[u];
#pragma unroll
      for (uint32_t e = 0; first != nullptr && e < kPerVec; ++e) {
        if (bad<Bits, kExponent>(w.b[e])) {
          atomicMin(first, static_cast<unsigned long long>(elem_base + u * kPerVec + e));
          break;
        }
      }
      *reinterpret_cast<uint4*>(g.dst(pages, is_v, u)) = w.u4;
    }
  } else {
    for (uint64_t u = uint64_t{blockIdx.x} * kThreads + threadIdx.x; u < n_units; u += stride) {
      const Bits b = reinterpret_cast<const Bits*>(src)[u];
      if (first != nullptr && bad<Bits, kExponent>(b)) atomicMin(first, static_cast<unsigned long long>(elem_base + u));
      *reinterpret_cast<Bits*>(g.dst(pages, is_v, u)) = b;
    }
  }
}

template <typename Bits, Bits kExponent>
cudaError_t launch(const AppendRowsShape& s, const void* k, const void* v, uint64_t n, const AppendPages& pages,
                   uint32_t first_slot, uint64_t elem_base, unsigned long long* first_bad, uint8_t** table,
                   cudaStream_t st) {
  const uint64_t row_bytes = uint64_t{s.head_dim} * sizeof(Bits);
  // Rows start at multiples of row_bytes in their page (and K/V halves at
  // multiples of it too), so they are aligned when the pages and row_bytes are.
  const bool vectors = pages.aligned && row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v) % 16 == 0;
  Geometry g{};
  g.unit_bytes = vectors ? 16 : sizeof(Bits);
  g.row_units = row_bytes / g.unit_bytes;
  g.n_kv = s.n_kv_heads;
  g.page_tokens = s.page_tokens;
  g.first_slot = first_slot;
  g.row_bytes = row_bytes;
  g.half_page_bytes = uint64_t{s.page_tokens} * s.n_kv_heads * row_bytes;
  const uint64_t n_units = n * s.n_kv_heads * g.row_units;
  const uint64_t blocks = (n_units + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<uint32_t>(blocks < kMaxBlocks ? blocks : kMaxBlocks), 2);
  append_rows_kernel<Bits, kExponent><<<grid, kThreads, 0, st>>>(static_cast<const uint8_t*>(k),
                                                                 static_cast<const uint8_t*>(v), n_units, g, pages,
                                                                 vectors, elem_base, first_bad, table);
  return cudaGetLastError();
}

}  // namespace

cudaError_t append_rows(const AppendRowsShape& s, const void* k, const void* v, uint64_t n, const AppendPages& pages,
                        uint32_t first_slot, uint64_t elem_base, unsigned long long* first_bad, uint8_t** table,
                        cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  switch (s.dtype) {
    case DType::kF32:
      return launch<uint32_t, 0x7F800000u>(s, k, v, n, pages, first_slot, elem_base, first_bad, table, st);
    case DType::kF16:
      return launch<uint16_t, 0x7C00u>(s, k, v, n, pages, first_slot, elem_base, first_bad, table, st);
    case DType::kBF16:
      return launch<uint16_t, 0x7F80u>(s, k, v, n, pages, first_slot, elem_base, first_bad, table, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ssa::cuda
