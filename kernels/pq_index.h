// Host entry points of the GPU PQ index kernels (kernels/pq_index.cu): encoding
// keys from device KV pages into device code pages, and k-means training.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::cuda {

struct PqIndexShape {
  uint32_t n_kv_heads, head_dim, subspaces, centroids, page_tokens, page_shift;
  DType dtype;
};

// Codes of tokens [begin, end) (nearest centroid, lowest index on ties) written
// into the code pages. kv_pages, code_pages: device arrays of device page pointers;
// books: device [n_kv][M][K][sub]. Sub-vectors of at most 64 floats.
cudaError_t pq_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                      const float* books, uint32_t begin, uint32_t end, cudaStream_t st);

// The code of one token whose index is read from device memory when the kernel
// runs (*position; 0xFFFFFFFF: none), as pq_encode writes it (a decode step,
// kernels/step_plan.h).
cudaError_t pq_encode_at(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                         const float* books, const uint32_t* position, cudaStream_t st);

// Device bytes of the k-means workspace for n sample keys per head.
size_t kmeans_workspace_bytes(const PqIndexShape& s, uint32_t n);

// Training codebooks, all on the device, in three steps on one stream:
// pq_gather_sample copies the keys of n tokens spread evenly over the first
// n_tokens into the workspace as floats, sample[n_kv][n][head_dim] (the
// workspace's first bytes); pq_seed writes k-means++ seeds into books (device
// [n_kv][M][K][sub]), the seeds the CPU's kmeans_pp_seed picks from the same
// points (lib/index/kmeans_pp_rule.h); pq_lloyd then runs `iterations` Lloyd
// steps on books; none when n <= K, as on the CPU. An empty cluster restarts at
// the sample point the CPU's k-means would pick (lib/index/kmeans_rng.h). The
// same codebooks in every run: the seeding's sums and the centroid sums are
// integers. Sub-vectors of at most 64 floats, at most 256 centroids.
cudaError_t pq_gather_sample(const PqIndexShape& s, const uint8_t* const* kv_pages, uint32_t n_tokens,
                             uint32_t n, void* workspace, cudaStream_t st);
cudaError_t pq_seed(const PqIndexShape& s, uint32_t n, void* workspace, float* books, cudaStream_t st);
cudaError_t pq_lloyd(const PqIndexShape& s, uint32_t n, uint32_t iterations, void* workspace,
                     float* books, cudaStream_t st);

}  // namespace ssa::cuda
