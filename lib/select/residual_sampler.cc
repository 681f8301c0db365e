#include "residual_sampler.h"

#include <math.h>

#include <algorithm>

#include "common/inclusion_probability.h"
#include "common/sampling_hierarchy.h"

namespace ssa {

void compute_block_sums(const float* weights, size_t n, SelectScratch& scratch) {
  const size_t n_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  scratch.block_sums.resize(n_blocks);
  for (size_t b = 0; b < n_blocks; ++b) resum_block(weights, n, b, scratch);
}

void resum_block(const float* weights, size_t n, size_t b, SelectScratch& scratch) {
  const size_t t0 = b * kBlockTokens, t1 = std::min(n, t0 + kBlockTokens);
  double s = 0.0;
  for (size_t t = t0; t < t1; ++t) s += weights[t];
  scratch.block_sums[b] = s;
}

HierarchySampler build_sampler(const float* weights, size_t n, SelectScratch& scratch) {
  HierarchySampler s;
  s.weights = weights;
  s.n = n;
  s.n_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  s.n_chunks = (n + kChunkTokens - 1) / kChunkTokens;
  auto& chunks = scratch.chunk_sums;
  auto& prefix = scratch.chunk_prefix;
  chunks.assign(s.n_chunks, 0.0);
  prefix.resize(s.n_chunks);
  for (size_t b = 0; b < s.n_blocks; ++b) chunks[b / kBlocksPerChunk] += scratch.block_sums[b];
  double total = 0.0;
  for (size_t c = 0; c < s.n_chunks; ++c) {
    total += chunks[c];
    prefix[c] = total;
  }
  s.blocks = scratch.block_sums.data();
  s.chunks = chunks.data();
  s.prefix = prefix.data();
  s.total = total;
  return s;
}

uint32_t HierarchySampler::draw(const RngStream& rng, uint32_t index) const {
  const Philox4 r = rng_draw(rng, index);
  const uint32_t c = pick_from_prefix(prefix, static_cast<uint32_t>(n_chunks), rng_uniform(r.v[0]) * total);
  const size_t b0 = size_t{c} * kBlocksPerChunk;
  const uint32_t nb = static_cast<uint32_t>(std::min(n_blocks - b0, size_t{kBlocksPerChunk}));
  const uint32_t b = static_cast<uint32_t>(b0) + pick_by_scan(blocks + b0, nb, rng_uniform(r.v[1]) * chunks[c]);
  const size_t t0 = size_t{b} * kBlockTokens;
  const uint32_t nt = static_cast<uint32_t>(std::min(n - t0, size_t{kBlockTokens}));
  return static_cast<uint32_t>(t0) + pick_by_scan(weights + t0, nt, rng_uniform(r.v[2]) * blocks[b]);
}

double sample_residual(const float* weights, size_t n, uint32_t base, uint64_t m, float pi_min,
                       const RngStream& rng, SelectScratch& scratch, Selection* out) {
  const HierarchySampler sampler = build_sampler(weights, n, scratch);
  out->draws = m;
  if (m == 0 || sampler.total <= 0.0) return sampler.total;

  auto& drawn = scratch.drawn;
  drawn.clear();
  drawn.reserve(m);
  for (uint64_t j = 0; j < m; ++j) drawn.push_back(sampler.draw(rng, static_cast<uint32_t>(j)));
  std::sort(drawn.begin(), drawn.end());
  drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
  const double md = static_cast<double>(m);
  for (uint32_t t : drawn) {
    const double p = static_cast<double>(weights[t]) / sampler.total;
    out->tokens.push_back(base + t);
    out->log_pi.push_back(static_cast<float>(log(inclusion_probability(p, md, pi_min))));
  }
  out->unique = drawn.size();
  return sampler.total;
}

}  // namespace ssa
