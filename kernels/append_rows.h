// Host entry point of kernels/append_rows.cu: the K and V rows an append gives
// in device memory, copied into the session's device pages and scanned for NaN
// and infinity in the same pass (the host scan, lib/cpu/finite_check.h, cannot
// read them).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::cuda {

struct AppendRowsShape {
  uint32_t n_kv_heads, head_dim, page_tokens;
  DType dtype;
};

// The pages one launch writes, passed by value (no table upload, which from
// host memory may wait for the stream): K/V pages, and code pages (null when the
// layer has no codes).
inline constexpr uint32_t kAppendPagesPerLaunch = 64;
struct AppendPages {
  uint8_t* kv[kAppendPagesPerLaunch];
  uint8_t* code[kAppendPagesPerLaunch];
  uint32_t count;
  bool aligned;  // every K/V page pointer is a multiple of 16 bytes
};

// Enqueues on st: tokens [0, n) of k and v (device, token-major [n][n_kv][d])
// into rows first_slot + t of pages.kv (page i holds rows [i * page_tokens,
// (i + 1) * page_tokens), K of all heads first, then V, each head's rows
// contiguous: lib/store/kv_layout.h). With first_bad (device, two slots): lowers
// first_bad[0] (k) and [1] (v) to elem_base + the index of the array's first NaN
// or infinite element; the rows are written either way (the caller writes only
// rows no reader sees before it has checked). With table (device, 2 * count
// pointers): also writes pages.kv then pages.code there, the tables pq_encode
// reads next on st.
cudaError_t append_rows(const AppendRowsShape& s, const void* k, const void* v, uint64_t n, const AppendPages& pages,
                        uint32_t first_slot, uint64_t elem_base, unsigned long long* first_bad, uint8_t** table,
                        cudaStream_t st);

}  // namespace ssa::cuda
