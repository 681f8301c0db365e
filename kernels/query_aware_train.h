// The query-aware proxies' training steps per key on the GPU (kernels/
// query_aware_train.cu): what lib/index/query_transform.h and key_weights.h
// compute on the host, with the CPU's order of operations, so that a CUDA
// session learns the CPU backend's transforms and weights bit for bit while the
// host keeps only the d x d eigen-decompositions. The sample is the k-means
// workspace's [n_kv][n][head_dim] floats (pq_index.h).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "pq_index.h"

namespace ssa::cuda {

// y[h][i] = A_h x[h][i] for every sampled key, A_h given transposed (a_t:
// [n_kv][d][d] doubles, row j of head h is column j of A_h): whiten_keys's sums,
// each y[r] over j in order, in double, rounded once to float.
cudaError_t qa_whiten_keys(const PqIndexShape& s, uint32_t n, const double* a_t, const float* x, float* y,
                           cudaStream_t st);

// The upper triangle (j >= i) of sum_t y_t y_t^T per head into c ([n_kv][d][d]
// doubles; the lower triangle is left as it was): second_moment_rows's sums,
// each entry over t in order.
cudaError_t qa_second_moments(const PqIndexShape& s, uint32_t n, const float* y, double* c, cudaStream_t st);

// Device bytes of qa_key_weights's scratch for n keys and at most m queries a head.
size_t qa_key_weights_scratch_bytes(const PqIndexShape& s, uint32_t n, uint32_t m);

// heavy_key_weights for every head: the scores q . x of the sampled keys x by
// each head's recent queries (q: [n_kv][m_max][d] floats, head h's first
// counts[h] rows; counts: device [n_kv], 0 leaves the head's weights at 1), each
// query's heavy_key_count(n)-th highest score (exact, by radix selection), and
// w[h][i] = 1 + kHeavyKeyBoost x (queries whose threshold key i reaches) / m.
cudaError_t qa_key_weights(const PqIndexShape& s, uint32_t n, const float* x, const float* q, uint32_t m_max,
                           const uint32_t* counts, void* scratch, float* w, cudaStream_t st);

}  // namespace ssa::cuda
