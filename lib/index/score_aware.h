// Score-aware (anisotropic) product quantisation, after ScaNN: the error of a
// key's reconstruction r = x - x~ is weighed by how it moves the scores q . x
// that matter. Split r into its part along x and its part across; a query that
// scores x highly is nearly parallel to x, so the part along x moves its score
// the most. The loss of one key is
//
//     L(x, x~) = |r|^2 + (eta - 1) (r . x)^2 / |x|^2,
//
// eta = pq_parallel_weight (1: squared error, k-means). Both steps below lower L
// or leave it, so training never raises the loss it starts from (the k-means
// codebooks'). docs/ALGORITHM.md, section 4.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace ssa {

// Rounds of (assignment, centroid update) after k-means, and coordinate-descent
// sweeps over the subspaces per assignment (encode-on-append uses the same).
inline constexpr uint32_t kScoreAwareRounds = 4;
inline constexpr uint32_t kScoreAwareSweeps = 2;

// Whether a weight asks for the score-aware loss (0 and 1 mean squared error).
inline bool is_score_aware(float eta) { return eta > 1.0f; }

// One KV head's codebooks ([M][K][sub_dim] floats) prepared for assignment:
// each centroid's squared norm.
class ScoreAwareSearch {
 public:
  ScoreAwareSearch(const float* centroids, uint32_t M, uint32_t K, uint32_t sub_dim, double eta);
  // Codes of key x (M * sub_dim floats) minimising L: codes holds the starting
  // codes (the nearest centroids) and receives the result. Each subspace in
  // turn takes its best centroid with the others fixed (ties keep the current
  // code, then the lowest index), for kScoreAwareSweeps sweeps or until one
  // changes nothing. A zero key has L = |r|^2: its starting codes stay.
  void assign(const float* x, uint32_t* codes) const;
  // L(x, reconstruction of codes), in double.
  double loss(const float* x, const uint32_t* codes) const;

 private:
  const float* centroids_;
  uint32_t M_, K_, sub_;
  double eta_;
  std::vector<double> norms_;  // [M][K]
};

// The centroid step for fixed codes ([n][M]) of keys x ([n][M * sub_dim]): one
// subspace at a time (in order, each with the others' current centroids), each
// used centroid becomes the exact minimiser of its keys' total loss, the
// solution of a sub_dim x sub_dim positive definite system (Cholesky, double);
// a centroid no key uses is kept. centroids: [M][K][sub_dim], updated in place.
void score_aware_update_centroids(const float* x, size_t n, uint32_t M, uint32_t K, uint32_t sub_dim, double eta,
                                  const uint32_t* codes, float* centroids);

// Refines k-means codebooks of one KV head ([M][K][sub_dim] floats, updated in
// place) for the loss L on n keys x ([n][M * sub_dim] floats): kScoreAwareRounds
// rounds of assignment (ScoreAwareSearch, from the nearest centroids in the
// first round, from the previous codes after) and score_aware_update_centroids.
// Returns the mean loss after each assignment (rounds + 1 values: the last
// after the final update).
std::vector<double> score_aware_refine(const float* x, size_t n, uint32_t M, uint32_t K, uint32_t sub_dim,
                                       double eta, float* centroids);

}  // namespace ssa
