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

namespace ssa {

// The share of a query's top-scored training keys that count as its heavy keys.
inline constexpr double kHeavyKeyFraction = 0.05;
// A key every recent query holds among its heavy keys weighs 1 + this.
inline constexpr float kHeavyKeyBoost = 256.0f;

// keys x [n][d] and queries q [m][d] (m >= 1), floats: w[i] = 1 +
// kHeavyKeyBoost * (queries whose ceil(kHeavyKeyFraction * n) highest scores
// q . x reach key i's) / m. Deterministic: the same inputs give the same bits.
void heavy_key_weights(const float* x, size_t n, uint32_t d, const float* q, uint32_t m, float* w);

}  // namespace ssa
