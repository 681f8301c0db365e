// The pass over a query head's candidate scores that a selection makes once:
// the proposal weights exp(s - max) and their fixed-point sums per 32-token
// block (the sampler's lowest level), together with the scores at or above a
// threshold (the heavy set's candidates). Before it were three passes for the
// weights and their sums and two for the top-k, each over the whole context;
// at 1M tokens they cost more than scoring the context from its codes.
//
// The heavy set's threshold comes from a first pass that takes the maximum of
// every 32-score block and one score of each. At least k scores reach the k-th
// largest block maximum (each of those k blocks holds one), so the top k all
// lie among the scores at or above it; when high scores are scattered few
// others do (1.1-1.6 k on random scores). When they crowd into runs, as
// attention scores do (neighbouring keys alike), whole blocks pass it (5-8 k at
// 64K tokens of the benchmark's keys), and the one-in-32 sample then places the
// threshold better: where it expects 1.2 k scores and a margin. That estimate
// promises nothing, so the caller counts what the pass found and takes the
// whole-context top-k (radix_topk.h) when fewer than k or more than its cap
// passed.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace ssa {

// The first pass over x[0, n), in blocks of 32 from x[0] (the last one partial):
// each block's maximum and one of its scores (simd::sample_lane).
struct BlockSummary {
  std::vector<float> maxima, sample;
};
// Returns the largest score: the proposal's shift.
float summarize_blocks(const float* x, size_t n, BlockSummary* out);

// A threshold for the top k > 0 scores: the larger of the k-th largest block
// maximum and the sample's estimate; -INFINITY when neither exists (k above the
// number of blocks and the sample too small). `scratch` is overwritten.
float heavy_threshold(const BlockSummary& blocks, size_t k, std::vector<uint32_t>* scratch);

struct ProposalPass {
  // Fixed-point sums of the weights per block of absolute tokens [32 b, 32 b +
  // 32), clipped to the candidates: blocks[0] is the block of token `first`.
  std::vector<uint64_t> blocks;
  uint64_t total = 0;           // their sum: the proposal's normaliser
  std::vector<uint32_t> above;  // indices i with x[i] >= threshold, ascending (if they fit)
  size_t n_above = 0;           // how many there are (more than the cap: not all stored)
};

// One pass over x[0, n), candidate i being absolute token first + i. With
// weights (w not null): w[i] = exp(x[i] - shift), bitwise proposal_weights',
// and out->blocks, out->total. Always: the indices at or above `threshold`, at
// most `cap` of them stored.
void proposal_pass(const float* x, size_t n, uint64_t first, float shift, float threshold, size_t cap, float* w,
                   ProposalPass* out);

}  // namespace ssa
