// Which middle-of-context tokens a query head reads, and with what inclusion
// probability: the heavy set H (pi = 1) and the sampled residual S (pi < 1).
// Sink and local tokens are not part of this; the decode pipeline adds them.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "common/philox.h"
#include "fixed_point_sampler.h"
#include "proposal_pass.h"
#include "ssa.h"

namespace ssa {

struct Selection {
  std::vector<uint32_t> tokens;  // absolute token indices, heavy first, then samples
  std::vector<float> log_pi;     // log inclusion probability, same order (0 for heavy)
  uint64_t heavy = 0;            // |H|
  uint64_t draws = 0;            // m
  uint64_t unique = 0;           // |S|
  double residual_mass = 0.0;    // proxy softmax mass of the sampled residual R
  double heavy_seconds = 0.0;    // time spent choosing H (profiling)
  double sampling_seconds = 0.0; // time spent drawing S (profiling)
  void clear() {
    tokens.clear();
    log_pi.clear();
    heavy = draws = unique = 0;
    residual_mass = 0.0;
    heavy_seconds = sampling_seconds = 0.0;
  }
};

struct SelectParams {
  ssa_method method;
  uint64_t kprime;      // budget for the candidates (k minus sink and local)
  float heavy_fraction; // h
  float pi_min;
};

// Reusable per-thread buffers (context-sized).
struct SelectScratch {
  std::vector<float> weights;
  std::vector<float> proposal;  // error-targeted selection: weights before any are zeroed
  std::vector<double> block_sums, chunk_sums, chunk_prefix;
  std::vector<uint32_t> heavy, drawn, top, above_order, top_blocks;
  std::vector<uint8_t> is_heavy;
  std::vector<uint64_t> seen;  // select_tokens' drawn tokens, one bit each
  BlockSummary blocks;  // select_tokens' heavy-set threshold
  std::vector<float> above_scores;
  ProposalPass pass;
  FixedHierarchy hierarchy;  // select_tokens' residual sampler
};

// proxy: scores (attention-logit units) of the candidates, candidate j being token
// `base + j`, n of them; requires 0 < kprime < n. Fills *out.
void select_tokens(const SelectParams& p, const float* proxy, size_t n, uint32_t base,
                   const RngStream& rng, SelectScratch& scratch, Selection* out);

// |H| for the fixed-fraction methods: round(h * k'), never above k'.
uint64_t fixed_heavy_count(ssa_method method, uint64_t kprime, float h);

// The steps of select_tokens that a sharded decode (lib/shard/sharded_decode.cc)
// runs on its shards' parts, so that both make the same arithmetic:
// |H| of SSA_ADAPTIVE from the top k' proposal probabilities, sorted descending;
size_t adaptive_heavy_count(const double* q_sorted, size_t n, uint64_t kprime);
// the residual's share of the proposal mass (fixed-point sums of all candidates
// and of the heavy ones);
double residual_mass_of(uint64_t proposal_total, uint64_t heavy_total);
// proposal weights w[0..n) turned into the method's residual weights (uniform:
// 1; heavy tokens are zeroed by the caller);
void residual_weights(ssa_method method, float* w, size_t n);
// the unique drawn tokens (absolute, sorted) of a range whose weights w start at
// token `first`, appended to *out as token - token_offset with their log pi
// (m draws over the whole residual of fixed-point total grand_total).
void add_samples(const std::vector<uint32_t>& drawn_sorted_unique, const float* w, uint64_t first,
                 uint64_t grand_total, uint64_t m, float pi_min, uint32_t token_offset, Selection* out);

}  // namespace ssa
