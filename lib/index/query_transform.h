// The key transform of the query-aware proxies (SSA_PROXY_QPQ, _QPQ4;
// docs/ALGORITHM.md, section 4). A score's error is q . r for a key's
// quantisation error r; over queries of second moment S = E[q q^T] its mean
// square is r^T S r = |A r|^2 with A = L^(1/2) U^T (S = U L U^T). So product
// quantisation of A k under squared error minimises the expected squared score
// error, and the query scores as A^-T q: (A^-T q) . (A k) = q . k.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "store/query_moments.h"

namespace ssa {

class ThreadPool;  // cpu/thread_pool.h

// Eigenvalues of S below this fraction of the largest are raised to it: it
// bounds the transform's condition number (to 1 / sqrt of it, ~32), so float
// transforms stay inverse to each other within kTransformTolerance, and
// directions the observed queries barely use still get some of the codebooks:
// a few dozen queries per KV head estimate S poorly there. 1e-3 of 1e-1..1e-4
// measured best over both models (docs/FIDELITY.md, "The eigenvalue floor").
inline constexpr double kQueryEigenFloor = 1e-3;

// What a stored pair may deviate from T^T Q = I (float rounding of double
// transforms of condition number <= 32 is ~1e-5 per entry).
inline constexpr double kTransformTolerance = 1e-3;

// T and Q ([d][d] row-major floats) for keys x ([n][d]) and the observed
// queries' moment sum ([d][d], symmetric) over `count` queries: T = R A and
// Q = R A^-T, R the variance-balanced PCA rotation (rotation.h) of the
// transformed keys A x. With no queries (count 0, or no spread) A is the
// identity: T = Q = R, OPQ's starting rotation.
void query_aware_transform(const float* x, size_t n, uint32_t d, uint32_t subspaces, const double* moment_sum,
                           uint64_t count, float* t, float* q);

// Its steps, so that the ones per key can run in parallel with the bits of one
// pass: A and A^-T from the moments (row-major d x d; A^T kept for the keys);
// y = A x for keys [i0, i1) of x ([n][d] floats) into the same rows of y, each
// row's bits independent of the split; then T = R A and Q = R A^-T for R the
// variance-balanced PCA rotation of all of y (rotation.h).
struct QueryWhitening {
  std::vector<double> a, a_inv_t, a_t;
};
QueryWhitening query_whitening(const double* moment_sum, uint64_t count, uint32_t d);
void whiten_keys(const QueryWhitening& w, const float* x, size_t i0, size_t i1, uint32_t d, float* y);
void finish_query_transform(const QueryWhitening& w, const std::vector<double>& rot, uint32_t d, float* t,
                            float* q);

// `prev` (null: none yet) plus n queries q ([n][n_q][d] floats; query head h
// belongs to KV head h / (n_q / n_kv)): each KV head's count grows by n times
// its group size and its sum by q q^T of each of its query heads' queries, and
// its recent queries end with these (the last kRecentQueries in all). With a
// pool the KV heads are summed in parallel (the same bits).
std::shared_ptr<QueryMoments> add_query_moments(const QueryMoments* prev, uint32_t n_kv, uint32_t n_q, uint32_t d,
                                                const float* q, uint64_t n, ThreadPool* pool = nullptr);

// A hash of the counts, sums and recent queries (0 for null: no query
// observed), so that
// processes that must have observed the same queries can compare them.
uint64_t query_moments_hash(const QueryMoments* m);

// Largest |(T^T Q - I)[i][j]| of two row-major d x d float matrices (infinity
// if any entry is not finite).
double inverse_transpose_error(const float* t, const float* q, uint32_t d);

}  // namespace ssa
