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
  // 8: one code byte per subspace ([h][m][slot]); 4: two per byte ([h][m / 2][slot],
  // the even subspace in the low nibble), the CPU backend's code layout.
  uint32_t code_bits = 8;
  // Keys are multiplied by their KV head's transform T before quantising (OPQ,
  // QPQ): T follows the centroids in the device codebooks (device_books_layout).
  bool key_transform = false;
};

// Floats of one layer's device codebooks: the centroids [n_kv][M][K][sub], then,
// for a transformed proxy, each KV head's key transform T [n_kv][d][d], then the
// matrix its query is multiplied by before its table is built (R for OPQ, T^-T
// for QPQ) [n_kv][d][d]; all row-major.
struct DeviceBooksLayout {
  size_t centroids, transform;  // floats of the centroids, of one of the two transform sets
  SSA_HD size_t key_transform_offset() const { return centroids; }
  SSA_HD size_t query_transform_offset() const { return centroids + transform; }
  SSA_HD size_t floats() const { return centroids + 2 * transform; }
};
SSA_HD DeviceBooksLayout device_books_layout(const PqIndexShape& s) {
  const size_t d = s.head_dim;
  return {size_t{s.n_kv_heads} * s.centroids * d, s.key_transform ? size_t{s.n_kv_heads} * d * d : 0};
}

// Codes of tokens [begin, end) (nearest centroid, lowest index on ties) written
// into the code pages. kv_pages, code_pages: device arrays of device page pointers;
// books: device codebooks as device_books_layout says. A transformed key is
// T k with the CPU backend's order of operations (lib/index/pq_index.cc,
// rotate: eight interleaved partial sums, no fused multiply-adds), so that its
// bits are the CPU's. Sub-vectors of at most 64 floats.
cudaError_t pq_encode(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                      const float* books, uint32_t begin, uint32_t end, cudaStream_t st);

// The code of one token whose index is read from device memory when the kernel
// runs (*position; 0xFFFFFFFF: none), as pq_encode writes it (a decode step,
// kernels/step_plan.h).
cudaError_t pq_encode_at(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                         const float* books, const uint32_t* position, cudaStream_t st);

// pq_encode's codes for a transformed proxy (s.key_transform; head_dim a
// multiple of 8), the keys transformed first, scratch_tokens at a time, into
// `scratch` (device, pq_encode_scratch_bytes(s, scratch_tokens)) by a kernel that
// multiplies them by T in tiles (the same bits as pq_encode's), then quantised.
// For ranges of thousands of tokens: pq_encode transforms each key's sub-vectors
// in the block of its subspace, which costs more per key.
size_t pq_encode_scratch_bytes(const PqIndexShape& s, uint32_t tokens);
cudaError_t pq_encode_transformed(const PqIndexShape& s, const uint8_t* const* kv_pages, uint8_t* const* code_pages,
                                  const float* books, uint32_t begin, uint32_t end, float* scratch,
                                  uint32_t scratch_tokens, cudaStream_t st);

// Device bytes of the k-means workspace for n sample keys per head.
size_t kmeans_workspace_bytes(const PqIndexShape& s, uint32_t n);

// Training codebooks, all on the device, in three steps on one stream:
// pq_gather_sample copies the keys of n tokens spread evenly over the first
// n_tokens into the workspace as floats, sample[n_kv][n][head_dim] (the
// workspace's first bytes); with s.key_transform it writes each key's T k
// instead, T from `books` (device_books_layout; null otherwise), with the bits
// of pq_encode's transformed keys. pq_seed writes k-means++ seeds into books
// (device [n_kv][M][K][sub]), the seeds the CPU's kmeans_pp_seed picks from the
// same points (lib/index/kmeans_pp_rule.h); pq_lloyd then runs `iterations` Lloyd
// steps on books; none when n <= K, as on the CPU. An empty cluster restarts at
// the sample point the CPU's k-means would pick (lib/index/kmeans_rng.h).
// `weighted`: the workspace's weights [n_kv][n] (kmeans_sample_weights; each
// finite and >= 1) weigh the points as kmeans_train's weights do. The same
// codebooks in every run: the seeding's sums and the centroid sums are
// integers. Sub-vectors of at most 64 floats, at most 256 centroids.
cudaError_t pq_gather_sample(const PqIndexShape& s, const uint8_t* const* kv_pages, uint32_t n_tokens,
                             uint32_t n, const float* books, void* workspace, cudaStream_t st);
cudaError_t pq_seed(const PqIndexShape& s, uint32_t n, bool weighted, void* workspace, float* books,
                    cudaStream_t st);
cudaError_t pq_lloyd(const PqIndexShape& s, uint32_t n, uint32_t iterations, bool weighted, void* workspace,
                     float* books, cudaStream_t st);
// Where the workspace keeps the sample's weights (n_kv x n floats, device memory).
float* kmeans_sample_weights(const PqIndexShape& s, uint32_t n, void* workspace);

}  // namespace ssa::cuda
