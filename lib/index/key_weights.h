// Training weights of the query-aware proxies' keys (docs/ALGORITHM.md,
// section 4). A ranking proxy must order the keys that some query scores high;
// a key no query ranks near the top only has to stay below them. So each
// training key weighs 1 plus kHeavyKeyBoost times the share of the layer's
// recent queries (QueryMoments::recent) whose top kHeavyKeyFraction of the
// training keys holds it, and k-means spends its centroids accordingly
// (kmeans_train's weights). At the same bytes this lifts top-2% recall on
// SmolLM2's keys by 0.023-0.028 (QPQ) and 0.039-0.043 (QPQ4), on Gemma-3's by
// 0.008 and 0.041 (docs/FIDELITY.md, "Key weights").
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace ssa {

// The share of a query's top-scored training keys that count as its heavy keys.
inline constexpr double kHeavyKeyFraction = 0.05;
// A key every recent query holds among its heavy keys weighs 1 + this.
inline constexpr float kHeavyKeyBoost = 256.0f;

// keys x [n][d] and queries q [m][d] (m >= 1), floats: w[i] = 1 +
// kHeavyKeyBoost * (queries whose ceil(kHeavyKeyFraction * n) highest scores
// q . x reach key i's) / m. Deterministic: the same inputs give the same bits.
void heavy_key_weights(const float* x, size_t n, uint32_t d, const float* q, uint32_t m, float* w);

// Its steps, so that they can run in parallel with the bits of one pass: the
// queries as [d][m]; the scores q . x of keys [i0, i1) into those rows of
// scores [n][m]; query j's threshold, the heavy_key_count(n)-th highest of its
// scores (column: scratch); the weights of keys [i0, i1) from every query's
// threshold.
std::vector<float> transposed_queries(const float* q, uint32_t m, uint32_t d);
void key_query_scores(const float* x, size_t i0, size_t i1, uint32_t d, const float* qt, uint32_t m,
                      float* scores);
size_t heavy_key_count(size_t n);
float heavy_threshold(const float* scores, size_t n, uint32_t m, uint32_t j, std::vector<float>& column);
void weights_from_thresholds(const float* scores, size_t i0, size_t i1, uint32_t m, const float* thresholds,
                             float* w);

}  // namespace ssa
