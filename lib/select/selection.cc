#include "selection.h"

#include <math.h>

#include <algorithm>
#include <chrono>

#include "common/inclusion_probability.h"
#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "cpu/simd.h"
#include "fixed_point_sampler.h"
#include "radix_topk.h"

namespace ssa {
namespace {

bool samples_residual(ssa_method m) {
  return m == SSA_METHOD_SSA || m == SSA_METHOD_SAMPLING || m == SSA_METHOD_HYBRID_UNIFORM ||
         m == SSA_METHOD_SSA_ADAPTIVE;
}

// Adaptive heavy set: water-filling over the proposal q = softmax(proxy). Only the
// top k' can be heavy, so those are sorted and handed to water_fill.
void adaptive_heavy(const float* proxy, const float* weights, double total, size_t n,
                    uint64_t kprime, std::vector<uint32_t>* heavy) {
  std::vector<uint32_t> top;
  topk_indices(proxy, n, kprime, 0, &top);
  std::sort(top.begin(), top.end(), [&](uint32_t a, uint32_t b) {
    return proxy[a] != proxy[b] ? proxy[a] > proxy[b] : a < b;
  });
  std::vector<double> q(top.size());
  for (size_t i = 0; i < top.size(); ++i) q[i] = static_cast<double>(weights[top[i]]) / total;
  heavy->assign(top.begin(), top.begin() + static_cast<ptrdiff_t>(adaptive_heavy_count(q.data(), q.size(), kprime)));
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
  auto& heavy = scratch.heavy;
  heavy.clear();
  auto& w = scratch.weights;
  uint64_t proposal_total = 0;
  if (samples_residual(p.method)) {
    // Proposal weights exp(s~ - max): the unnormalised softmax of the proxy. Its
    // normaliser is their fixed-point sum (exact: a sharded decode's shards
    // sum theirs to the same value).
    w.resize(n);
    proposal_weights(proxy, n, simd::kernels().max_value(proxy, n), w.data());
    proposal_total = fixed_sum(w.data(), n);
  }

  if (p.method == SSA_METHOD_SSA_ADAPTIVE) {
    adaptive_heavy(proxy, w.data(), fixed_to_double(proposal_total), n, p.kprime, &heavy);
  } else {
    topk_indices(proxy, n, fixed_heavy_count(p.method, p.kprime, p.heavy_fraction), 0, &heavy);
  }
  for (uint32_t j : heavy) {
    out->tokens.push_back(base + j);
    out->log_pi.push_back(0.0f);
  }
  out->heavy = heavy.size();
  const auto t1 = Clock::now();
  out->heavy_seconds = std::chrono::duration<double>(t1 - t0).count();
  if (!samples_residual(p.method)) return;

  const uint64_t m = p.kprime - heavy.size();
  uint64_t heavy_total = 0;
  for (uint32_t j : heavy) heavy_total += fixed_weight(w[j]);
  out->residual_mass = residual_mass_of(proposal_total, heavy_total);
  residual_weights(p.method, w.data(), n);
  for (uint32_t j : heavy) w[j] = 0.0f;
  scratch.hierarchy.build(w.data(), base, n);
  out->draws = m;
  auto& drawn = scratch.drawn;
  drawn.clear();
  draw_range(scratch.hierarchy, 0, scratch.hierarchy.total(), m, rng, &drawn);
  std::sort(drawn.begin(), drawn.end());
  drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
  add_samples(drawn, w.data(), base, scratch.hierarchy.total(), m, p.pi_min, 0, out);
  out->sampling_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
}

}  // namespace ssa
