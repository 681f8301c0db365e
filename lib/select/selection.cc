#include "selection.h"

#include <math.h>

#include <algorithm>
#include <chrono>

#include "common/inclusion_probability.h"
#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "cpu/simd.h"
#include "fixed_point_sampler.h"
#include "proposal_pass.h"
#include "radix_topk.h"

namespace ssa {
namespace {

bool samples_residual(ssa_method m) {
  return m == SSA_METHOD_SSA || m == SSA_METHOD_SAMPLING || m == SSA_METHOD_HYBRID_UNIFORM ||
         m == SSA_METHOD_SSA_ADAPTIVE;
}

// Adaptive heavy set: water-filling over the proposal q = softmax(proxy). Only the
// top k' can be heavy, so those are sorted and handed to water_fill.
void adaptive_heavy(std::vector<uint32_t>* top, const float* proxy, const float* weights, double total,
                    uint64_t kprime, std::vector<uint32_t>* heavy) {
  std::sort(top->begin(), top->end(), [&](uint32_t a, uint32_t b) {
    return proxy[a] != proxy[b] ? proxy[a] > proxy[b] : a < b;
  });
  std::vector<double> q(top->size());
  for (size_t i = 0; i < top->size(); ++i) q[i] = static_cast<double>(weights[(*top)[i]]) / total;
  heavy->assign(top->begin(), top->begin() + static_cast<ptrdiff_t>(adaptive_heavy_count(q.data(), q.size(), kprime)));
}

// The k largest scores' indices (ties to the lower index): from the pass's
// indices at or above the threshold when at least k and at most the cap
// passed it, else from all of the scores.
void top_scores(const float* proxy, size_t n, size_t k, const ProposalPass& pass, size_t cap,
                SelectScratch& scratch, std::vector<uint32_t>* top) {
  top->clear();
  if (k == 0) return;
  if (cap == 0 || pass.n_above < k || pass.n_above > cap) {
    topk_indices(proxy, n, k, 0, top);
    return;
  }
  auto& scores = scratch.above_scores;
  scores.resize(pass.above.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = proxy[pass.above[i]];
  // The indices ascend, so ties among them still go to the lower token.
  auto& order = scratch.above_order;
  order.clear();
  topk_indices(scores.data(), scores.size(), k, 0, &order);
  for (uint32_t j : order) top->push_back(pass.above[j]);
}

// The drawn tokens (in [first, first + n), with repeats) sorted, each once: by
// marking them in a bitmap of the range, cheaper than sorting the draws.
void sort_unique(uint64_t first, size_t n, std::vector<uint64_t>* seen, std::vector<uint32_t>* drawn) {
  seen->assign((n + 63) / 64, 0);
  for (uint32_t t : *drawn) (*seen)[(t - first) / 64] |= uint64_t{1} << ((t - first) % 64);
  drawn->clear();
  for (size_t i = 0; i < seen->size(); ++i) {
    for (uint64_t bits = (*seen)[i]; bits != 0; bits &= bits - 1) {
      drawn->push_back(static_cast<uint32_t>(first + i * 64 + static_cast<uint64_t>(__builtin_ctzll(bits))));
    }
  }
}

}  // namespace

size_t adaptive_heavy_count(const double* q_sorted, size_t n, uint64_t kprime) {
  return water_fill(q_sorted, n, 1.0, static_cast<double>(kprime)).heavy;
}

double residual_mass_of(uint64_t proposal_total, uint64_t heavy_total) {
  return proposal_total > 0 ? static_cast<double>(proposal_total - heavy_total) / static_cast<double>(proposal_total)
                            : 0.0;
}

void residual_weights(ssa_method method, float* w, size_t n) {
  if (method == SSA_METHOD_HYBRID_UNIFORM) {
    for (size_t i = 0; i < n; ++i) w[i] = 1.0f;
  }
}

void add_samples(const std::vector<uint32_t>& drawn_sorted_unique, const float* w, uint64_t first,
                 uint64_t grand_total, uint64_t m, float pi_min, uint32_t token_offset, Selection* out) {
  const double md = static_cast<double>(m), total = static_cast<double>(grand_total);
  for (uint32_t t : drawn_sorted_unique) {
    const double p = static_cast<double>(fixed_weight(w[t - first])) / total;
    out->tokens.push_back(t - token_offset);
    out->log_pi.push_back(static_cast<float>(log(inclusion_probability(p, md, pi_min))));
  }
  out->unique += drawn_sorted_unique.size();
}

uint64_t fixed_heavy_count(ssa_method method, uint64_t kprime, float h) {
  switch (method) {
    case SSA_METHOD_ORACLE_TOPK:
    case SSA_METHOD_PQ_TOPK: return kprime;
    case SSA_METHOD_SAMPLING: return 0;
    default: {
      const double v = nearbyint(static_cast<double>(h) * static_cast<double>(kprime));
      return std::min<uint64_t>(kprime, static_cast<uint64_t>(v < 0 ? 0 : v));
    }
  }
}

void select_tokens(const SelectParams& p, const float* proxy, size_t n, uint32_t base,
                   const RngStream& rng, SelectScratch& scratch, Selection* out) {
  out->clear();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const bool residual = samples_residual(p.method), adaptive = p.method == SSA_METHOD_SSA_ADAPTIVE;
  // The heavy set comes from the top k scores: all of them, or for SSA_ADAPTIVE
  // the k' that water-filling chooses among.
  const uint64_t k = adaptive ? p.kprime : fixed_heavy_count(p.method, p.kprime, p.heavy_fraction);
  // Pass 1: block maxima and a sample. The largest maximum is the proposal's
  // shift, and a threshold for the top k comes from them (proposal_pass.h).
  const float shift = summarize_blocks(proxy, n, &scratch.blocks);
  const float threshold = k > 0 ? heavy_threshold(scratch.blocks, k, &scratch.top_blocks) : INFINITY;
  const size_t cap = k > 0 && threshold > -INFINITY ? 4 * k + 1024 : 0;
  // Pass 2: proposal weights exp(s~ - max), the unnormalised softmax of the
  // proxy, with their fixed-point block sums (exact: a sharded decode's shards
  // sum theirs to the same total), and the scores at or above the threshold.
  auto& w = scratch.weights;
  if (residual) w.resize(n);
  ProposalPass& pass = scratch.pass;
  proposal_pass(proxy, n, base, shift, threshold, cap, residual ? w.data() : nullptr, &pass);
  const uint64_t proposal_total = pass.total;

  auto& heavy = scratch.heavy;
  if (adaptive) {
    top_scores(proxy, n, k, pass, cap, scratch, &scratch.top);
    adaptive_heavy(&scratch.top, proxy, w.data(), fixed_to_double(proposal_total), p.kprime, &heavy);
  } else {
    top_scores(proxy, n, k, pass, cap, scratch, &heavy);
  }
  for (uint32_t j : heavy) {
    out->tokens.push_back(base + j);
    out->log_pi.push_back(0.0f);
  }
  out->heavy = heavy.size();
  const auto t1 = Clock::now();
  out->heavy_seconds = std::chrono::duration<double>(t1 - t0).count();
  if (!residual) return;

  const uint64_t m = p.kprime - heavy.size();
  uint64_t heavy_total = 0;
  for (uint32_t j : heavy) heavy_total += fixed_weight(w[j]);
  out->residual_mass = residual_mass_of(proposal_total, heavy_total);
  if (p.method == SSA_METHOD_HYBRID_UNIFORM) {
    residual_weights(p.method, w.data(), n);
    for (uint32_t j : heavy) w[j] = 0.0f;
    scratch.hierarchy.build(w.data(), base, n);
  } else {
    // The residual is the proposal less the heavy tokens: out of their blocks.
    const uint64_t b0 = base / kBlockTokens;
    for (uint32_t j : heavy) {
      pass.blocks[(base + j) / kBlockTokens - b0] -= fixed_weight(w[j]);
      w[j] = 0.0f;
    }
    scratch.hierarchy.adopt(w.data(), base, n, &pass.blocks);
  }
  out->draws = m;
  auto& drawn = scratch.drawn;
  drawn.clear();
  draw_range(scratch.hierarchy, 0, scratch.hierarchy.total(), m, rng, &drawn);
  sort_unique(base, n, &scratch.seen, &drawn);
  add_samples(drawn, w.data(), base, scratch.hierarchy.total(), m, p.pi_min, 0, out);
  out->sampling_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
}

}  // namespace ssa
