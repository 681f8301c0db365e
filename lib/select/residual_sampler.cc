#include "residual_sampler.h"

#include <math.h>

#include <algorithm>

#include "common/inclusion_probability.h"
#include "common/sampling_hierarchy.h"

namespace ssa {

void compute_block_sums(const float* weights, size_t n, SelectScratch& scratch) {
  const size_t n_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  scratch.block_sums.resize(n_blocks);
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t t0 = b * kBlockTokens, t1 = std::min(n, t0 + kBlockTokens);
    double s = 0.0;
    for (size_t t = t0; t < t1; ++t) s += weights[t];
    scratch.block_sums[b] = s;
  }
}

double sample_residual(const float* weights, size_t n, uint32_t base, uint64_t m, float pi_min,
                       const RngStream& rng, SelectScratch& scratch, Selection* out) {
  const size_t n_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  const size_t n_chunks = (n + kChunkTokens - 1) / kChunkTokens;
  const auto& blocks = scratch.block_sums;
  auto& chunks = scratch.chunk_sums;
  auto& prefix = scratch.chunk_prefix;
  chunks.assign(n_chunks, 0.0);
  prefix.resize(n_chunks);
  for (size_t b = 0; b < n_blocks; ++b) chunks[b / kBlocksPerChunk] += blocks[b];
  double total = 0.0;
  for (size_t c = 0; c < n_chunks; ++c) {
    total += chunks[c];
    prefix[c] = total;
  }
  out->draws = m;
  if (m == 0 || total <= 0.0) return total;

  auto& drawn = scratch.drawn;
  drawn.clear();
  drawn.reserve(m);
  for (uint64_t j = 0; j < m; ++j) {
    const Philox4 r = rng_draw(rng, static_cast<uint32_t>(j));
    const uint32_t c = pick_from_prefix(prefix.data(), static_cast<uint32_t>(n_chunks),
                                        rng_uniform(r.v[0]) * total);
    const size_t b0 = size_t{c} * kBlocksPerChunk;
    const uint32_t nb = static_cast<uint32_t>(std::min(n_blocks - b0, size_t{kBlocksPerChunk}));
    const uint32_t b = static_cast<uint32_t>(b0) +
                       pick_by_scan(blocks.data() + b0, nb, rng_uniform(r.v[1]) * chunks[c]);
    const size_t t0 = size_t{b} * kBlockTokens;
    const uint32_t nt = static_cast<uint32_t>(std::min(n - t0, size_t{kBlockTokens}));
    const uint32_t t = static_cast<uint32_t>(t0) +
                       pick_by_scan(weights + t0, nt, rng_uniform(r.v[2]) * blocks[b]);
    drawn.push_back(t);
  }
  std::sort(drawn.begin(), drawn.end());
  drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
  const double md = static_cast<double>(m);
  for (uint32_t t : drawn) {
    const double p = static_cast<double>(weights[t]) / total;
    out->tokens.push_back(base + t);
    out->log_pi.push_back(static_cast<float>(log(inclusion_probability(p, md, pi_min))));
  }
  out->unique = drawn.size();
  return total;
}

}  // namespace ssa
