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

// Enqueues on st: tokens [0, n) of k and v (device, token-major [n][n_kv][d])
// into rows first_slot + t of the pages (a device array of device page
// pointers; page i holds rows [i * page_tokens, (i + 1) * page_tokens), K of all
// heads first, then V, each head's rows contiguous: lib/store/kv_layout.h), and
// lowers first_bad[0] (k) and first_bad[1] (v), set to n * n_kv * d or more by
// the caller, to the index of the array's first NaN or infinite element. The
// rows are written whether or not one is bad: the caller writes only rows that
// no reader sees until it has checked.
// pages_aligned: every page pointer is a multiple of 16 bytes.
cudaError_t append_rows(const AppendRowsShape& s, const void* k, const void* v, uint64_t n, uint8_t* const* pages,
                        bool pages_aligned, uint32_t first_slot, unsigned long long* first_bad, cudaStream_t st);

}  // namespace ssa::cuda
