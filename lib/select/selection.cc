#include "selection.h"

#include <math.h>

#include <algorithm>
#include <chrono>

#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "cpu/simd.h"
#include "radix_topk.h"
#include "residual_sampler.h"

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
  const WaterFill wf = water_fill(q.data(), q.size(), 1.0, static_cast<double>(kprime));
  heavy->assign(top.begin(), top.begin() + static_cast<ptrdiff_t>(wf.heavy));
}

}  // namespace

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
  double total = 0.0;
  if (samples_residual(p.method)) {
    // Proposal weights exp(s~ - max): the unnormalised softmax of the proxy,
    // with the sampler's 32-token block sums from the same pass.
    const auto& kern = simd::kernels();
    w.resize(n);
    scratch.block_sums.resize((n + kBlockTokens - 1) / kBlockTokens);
    total = kern.exp_shifted(proxy, kern.max_value(proxy, n), w.data(), n, scratch.block_sums.data());
  }

  if (p.method == SSA_METHOD_SSA_ADAPTIVE) {
    adaptive_heavy(proxy, w.data(), total, n, p.kprime, &heavy);
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
  double heavy_mass = 0.0;
  for (uint32_t j : heavy) {
    heavy_mass += w[j];
    w[j] = 0.0f;
  }
  out->residual_mass = total > 0.0 ? std::max(0.0, 1.0 - heavy_mass / total) : 0.0;
  if (p.method == SSA_METHOD_HYBRID_UNIFORM) {
    // Uniform over the residual: unit weight for every non-heavy candidate.
    std::fill(w.begin(), w.end(), 1.0f);
    for (uint32_t j : heavy) w[j] = 0.0f;
    compute_block_sums(w.data(), n, scratch);
  } else {
    // Blocks that lost heavy tokens are summed again, exactly.
    for (uint32_t j : heavy) resum_block(w.data(), n, j / kBlockTokens, scratch);
  }
  sample_residual(w.data(), n, base, m, p.pi_min, rng, scratch, out);
  out->sampling_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
}

}  // namespace ssa
