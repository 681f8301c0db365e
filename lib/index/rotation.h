// The linear algebra of the transformed proxies (OPQ, QPQ): a symmetric
// eigen-decomposition (Householder tridiagonalisation and QL iterations) for
// second moments, a one-sided Jacobi SVD for the orthogonal Procrustes fit (small
// d x d matrices, d <= 512, in double), and the orthogonality check a loaded
// rotation must pass. Deterministic: the same input gives the same bits.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace ssa {

// Thin SVD of a square d x d matrix a (row-major): a = U diag(s) V^T. Returns U
// and V row-major with orthonormal columns (a column of U whose singular value
// vanishes is completed to an orthonormal basis) and s >= 0, not sorted.
struct Svd {
  std::vector<double> u, s, v;
};
Svd jacobi_svd(const std::vector<double>& a, uint32_t d);

// Eigen-decomposition of a symmetric d x d matrix a (row-major, only its
// symmetric part is meaningful): a = V diag(values) V^T with V orthogonal, column
// e of the row-major `vectors` the eigenvector of values[e] (values unsorted, of
// either sign). Deterministic, as jacobi_svd, and several times faster.
struct SymmetricEigen {
  std::vector<double> values, vectors;
};
SymmetricEigen symmetric_eigen(const std::vector<double>& a, uint32_t d);

// The orthogonal R (row-major d x d) maximising sum_ij m[i][j] R[i][j], i.e.
// minimising sum_t |R x_t - y_t|^2 when m = sum_t y_t x_t^T: R = U V^T.
std::vector<double> procrustes(const std::vector<double>& m, uint32_t d);

// The initial OPQ rotation of keys x ([n][d] floats): the eigenvectors of their
// second-moment matrix, as rows, grouped into `subspaces` blocks whose sums of
// eigenvalues are as equal as a greedy fill (largest first, each into the block
// with the least so far) makes them: every subspace gets a share of the
// variance, not the first few all of it.
std::vector<double> balanced_pca_rotation(const float* x, size_t n, uint32_t d, uint32_t subspaces);

// Its two steps, so that the first can run in parallel: rows [r0, r1) of the
// upper triangle (j >= i) of sum_t x_t x_t^T, each entry summed over t in order
// (any split of the rows gives the bits of one pass), into the row-major d x d c;
// then the rotation from c's upper triangle.
void second_moment_rows(const float* x, size_t n, uint32_t d, uint32_t r0, uint32_t r1, double* c);
std::vector<double> balanced_rotation_of(std::vector<double> c, uint32_t d, uint32_t subspaces);

// Largest |(R R^T - I)[i][j]| of a row-major d x d float matrix (infinity if
// any entry is not finite).
double orthogonality_error(const float* r, uint32_t d);

// What a stored rotation may deviate from orthogonal (float rounding of a
// double-precision orthogonal matrix is ~1e-7 per entry, ~d * 1e-7 in R R^T).
inline constexpr double kRotationTolerance = 1e-3;

}  // namespace ssa
