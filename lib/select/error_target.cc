#include "error_target.h"

#include <math.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/inclusion_probability.h"
#include "common/sampling_hierarchy.h"
#include "common/water_filling.h"
#include "cpu/simd.h"
#include "error_bound.h"
#include "radix_topk.h"
#include "residual_sampler.h"

namespace ssa {

void ExactSum::add(double logit, const float* v, uint32_t d) {
  if (y.size() != d) y.assign(d, 0.0);
  if (logit > m) {
    const double scale = m == -INFINITY ? 0.0 : exp(m - logit);
    z *= scale;
    for (double& x : y) x *= scale;
    m = logit;
  }
  const double e = exp(logit - m);
  z += e;
  for (uint32_t i = 0; i < d; ++i) y[i] += e * v[i];
}

namespace {

// Draws of the first round (the pilot) and the least a re-estimate uses after the
// heavy set grew: enough for a rough variance (about +-20% for light tails), which
// only steers the heavy set; the number of draws comes from all draws in the end.
constexpr uint64_t kPilotDraws = 64;
constexpr uint64_t kEstimateDraws = 32;
// Heavy-set growths per head (each followed by a re-estimate).
constexpr int kMaxGrowths = 8;
constexpr size_t kSortStep = 1024;

// Candidates in decreasing proxy order (ties: lower index first, as radix top-k
// breaks them), sorted lazily: the heavy set is a prefix of this order, and only
// as much of it is sorted as the budget search looks at.
class ProxyOrder {
 public:
  ProxyOrder(const float* proxy, const float* weights, double total, size_t n)
      : proxy_(proxy), weights_(weights), total_(total), n_(n) {
    prefix_.push_back(0.0);
  }
  size_t available() const { return order_.size(); }
  size_t size() const { return n_; }
  uint32_t at(size_t i) const { return order_[i]; }
  const double* probs() const { return probs_.data(); }
  // Proxy mass of candidates outside the first t (needs ensure(t)).
  double residual_mass(size_t t) const { return std::max(0.0, 1.0 - prefix_[t]); }

  void ensure(size_t t) {
    t = std::min(t, n_);
    if (t <= order_.size()) return;
    // The top-T of the total order (score desc, index asc) extends any top-T'
    // with T' < T, so re-selecting a larger prefix keeps the earlier one.
    const size_t want = std::min(n_, std::max({t, 2 * order_.size(), kSortStep}));
    order_.clear();
    topk_indices(proxy_, n_, want, 0, &order_);
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
      return proxy_[a] != proxy_[b] ? proxy_[a] > proxy_[b] : a < b;
    });
    probs_.resize(order_.size());
    prefix_.resize(order_.size() + 1);
    for (size_t i = 0; i < order_.size(); ++i) {
      probs_[i] = static_cast<double>(weights_[order_[i]]) / total_;
      prefix_[i + 1] = prefix_[i] + probs_[i];
    }
  }

 private:
  const float* proxy_;
  const float* weights_;
  double total_;
  size_t n_;
  std::vector<uint32_t> order_;
  std::vector<double> probs_, prefix_;
};

// |H| the method gives a budget k' for the candidates (k' < n). Sorts only as
// much of the proxy order as water-filling looks at (nothing for fixed h).
size_t heavy_count(const TargetParams& p, ProxyOrder& order, uint64_t kprime) {
  if (kprime == 0) return 0;
  if (p.method != SSA_METHOD_SSA_ADAPTIVE) {
    return static_cast<size_t>(fixed_heavy_count(p.method, kprime, p.heavy_fraction));
  }
  // water_fill needs the sorted probabilities up to the first non-heavy one.
  order.ensure(std::min<uint64_t>(kprime, kSortStep));
  for (;;) {
    const size_t avail = order.available();
    const WaterFill wf = water_fill(order.probs(), avail, 1.0, static_cast<double>(kprime));
    if (wf.heavy < avail || avail >= kprime || avail == order.size()) return wf.heavy;
    order.ensure(2 * avail);
  }
}

// Sums over i.i.d. draws from the residual of x = w / p (w = exp(logit), p the
// draw probability) and of the values: enough for the ratio estimate and the
// per-draw variance of its linearisation, without keeping the rows. Scaled by
// exp(-M), M the largest logit added (rescaled when it grows).
class DrawMoments {
 public:
  explicit DrawMoments(uint32_t d) : s1_(d, 0.0), q1_(d, 0.0) {}
  uint64_t count() const { return m_; }

  void add(double logit, double p, const float* v) {
    if (logit > M_) {
      const double f = M_ == -INFINITY ? 0.0 : exp(M_ - logit);
      s0_ *= f;
      q0_ *= f * f;
      q2_ *= f * f;
      for (double& y : s1_) y *= f;
      for (double& y : q1_) y *= f * f;
      M_ = logit;
    }
    const double x = exp(logit - M_) / p;
    double vv = 0.0;
    for (size_t i = 0; i < s1_.size(); ++i) {
      s1_[i] += x * v[i];
      q1_[i] += x * x * v[i];
      vv += static_cast<double>(v[i]) * v[i];
    }
    s0_ += x;
    q0_ += x * x;
    q2_ += x * x * vv;
    ++m_;
  }

  // V = S^2 / (Z^2 ||o||^2): S^2 the sample variance of u = x (v - o) summed over
  // the head dimension, Z and o the ratio estimate with the exact rows. Infinite
  // when it cannot be estimated (fewer than 2 draws, o = 0).
  double relative_variance(const ExactSum& exact) const {
    if (m_ < 2) return INFINITY;
    const double Mx = std::max(M_, exact.m);
    const double fx = exp(M_ - Mx), fe = exact.z > 0.0 ? exp(exact.m - Mx) : 0.0;
    const double md = static_cast<double>(m_);
    const double Z = exact.z * fe + s0_ * fx / md;
    const size_t d = s1_.size();
    std::vector<double> o(d);
    double oo = 0.0;
    for (size_t i = 0; i < d; ++i) {
      o[i] = ((exact.z > 0.0 ? exact.y[i] * fe : 0.0) + s1_[i] * fx / md) / Z;
      oo += o[i] * o[i];
    }
    if (!(oo > 0.0) || !(Z > 0.0)) return INFINITY;
    // sum_j ||u_j||^2 = Q2 - 2 o.Q1 + ||o||^2 Q0; u_bar = (S1 - o S0) / m.
    double oq1 = 0.0, ubar2 = 0.0;
    for (size_t i = 0; i < d; ++i) {
      oq1 += o[i] * q1_[i];
      const double u = (s1_[i] - o[i] * s0_) / md;
      ubar2 += u * u;
    }
    const double sum_u2 = (q2_ - 2.0 * oq1 + oo * q0_) * fx * fx;
    const double s2 = std::max(0.0, (sum_u2 - md * ubar2 * fx * fx) / (md - 1.0));
    return s2 / (Z * Z * oo);
  }

 private:
  double M_ = -INFINITY, s0_ = 0.0, q0_ = 0.0, q2_ = 0.0;
  std::vector<double> s1_, q1_;
  uint64_t m_ = 0;
};

// The smallest budget k' > kcur for the candidates whose split by the method
// leaves the draws the variance needs, V scaled by the squared proxy residual
// mass; or, if none fits within the cap, the largest that fits (kcur if none).
// feasible(k') is monotone in k' (more heavy mass, more draws), so exponential
// then binary search; the probes stay within twice the answer, and so does the
// sorted part of the proxy order.
uint64_t search_budget(const TargetParams& p, ProxyOrder& order, uint64_t kcur, uint64_t cap,
                       size_t n_drawn, double c, double V, double eps2, double A) {
  const uint64_t n = order.size();
  auto feasible = [&](uint64_t k) {
    if (k >= n) return true;  // everything exact
    const size_t th = heavy_count(p, order, k);
    order.ensure(th);
    const double a = order.residual_mass(th) / A;
    return c * V * a * a / eps2 <= static_cast<double>(k - th);
  };
  // Whether k' keeps the rows within the cap: its heavy set plus the draws
  // already read (some of which it may absorb). Monotone in k'.
  auto fits = [&](uint64_t k) { return k >= n ? n <= cap : heavy_count(p, order, k) + n_drawn <= cap; };
  uint64_t lo = kcur;  // infeasible
  for (uint64_t probe = std::max<uint64_t>(2 * kcur, kcur + kPilotDraws);; probe *= 2) {
    probe = std::min(probe, cap);
    bool last = probe == cap;
    if (!fits(probe)) {  // the cap binds: the largest k' in (lo, probe) that fits
      uint64_t a = lo, b = probe;
      while (b - a > 1) {
        const uint64_t mid = a + (b - a) / 2;
        if (fits(mid)) a = mid; else b = mid;
      }
      probe = a;
      last = true;
    }
    if (probe <= lo) return kcur;
    if (feasible(probe)) {
      uint64_t hi = probe;
      while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (feasible(mid)) hi = mid; else lo = mid;
      }
      return hi;
    }
    lo = probe;
    if (last) return probe;  // not reachable within the cap: as far as it allows
  }
}

}  // namespace

void select_targeted(const TargetParams& p, const float* proxy, size_t n, uint32_t base,
                     const ExactRows& rows, const ExactSum& fixed, const RngStream& rng,
                     SelectScratch& scratch, Selection* out, TargetOutcome* outcome) {
  using Clock = std::chrono::steady_clock;
  const auto t_begin = Clock::now();
  out->clear();
  *outcome = TargetOutcome{};
  const uint32_t d = rows.head_dim();
  const auto& kern = simd::kernels();
  auto& w = scratch.weights;
  w.resize(n);
  scratch.block_sums.resize((n + kBlockTokens - 1) / kBlockTokens);
  const double W = kern.exp_shifted(proxy, kern.max_value(proxy, n), w.data(), n, scratch.block_sums.data());

  // k' = n means every candidate is read: exact, no error.
  const uint64_t cap = std::min<uint64_t>(p.kprime_cap, n);
  const uint64_t kfloor = std::min<uint64_t>(p.kprime_floor, cap);
  const double c = confidence_factor(p.delta);
  const double eps2 = p.epsilon * p.epsilon;
  // The proxy order reads the proposal weights lazily, after heavy ones were
  // zeroed in w: it gets a copy.
  scratch.proposal.assign(w.begin(), w.end());
  ProxyOrder order(proxy, scratch.proposal.data(), W, n);
  ExactSum exact = fixed;
  std::vector<float> vbuf(d);
  std::vector<uint32_t>& acc = scratch.drawn;  // draws from the current residual, in stream order
  acc.clear();
  size_t t = 0;       // |H|: the first t of `order`
  uint32_t next = 0;  // next counter of the RNG stream
  HierarchySampler sampler;
  DrawMoments mo(d);

  auto add_draw = [&](uint32_t j) {
    const double logit = rows.read(base + j, vbuf.data());
    mo.add(logit, static_cast<double>(w[j]) / sampler.total, vbuf.data());
  };
  // Draws (and reads) until `goal` draws are in hand.
  auto draw_to = [&](uint64_t goal) {
    while (acc.size() < goal && sampler.total > 0.0) {
      const uint32_t j = sampler.draw(rng, next++);
      acc.push_back(j);
      add_draw(j);
    }
  };
  // Makes the first t_new candidates (in proxy order) heavy: reads them exactly,
  // removes them from the sampler's weights, drops the draws that hit them, and
  // recomputes the moments of the rest under the new residual's probabilities
  // (re-reading their rows: the moments keep no rows).
  auto grow_heavy = [&](size_t t_new) {
    order.ensure(t_new);
    std::vector<size_t> dirty;
    for (size_t i = t; i < t_new; ++i) {
      const uint32_t j = order.at(i);
      exact.add(rows.read(base + j, vbuf.data()), vbuf.data(), d);
      w[j] = 0.0f;
      dirty.push_back(j / kBlockTokens);
    }
    std::sort(dirty.begin(), dirty.end());
    dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
    for (size_t b : dirty) resum_block(w.data(), n, b, scratch);
    t = std::max(t, t_new);
    acc.erase(std::remove_if(acc.begin(), acc.end(), [&](uint32_t j) { return w[j] == 0.0f; }), acc.end());
    sampler = build_sampler(w.data(), n, scratch);
    mo = DrawMoments(d);
    for (uint32_t j : acc) add_draw(j);
  };

  uint64_t kcur = kfloor;
  bool exact_all = kfloor == n;
  grow_heavy(exact_all ? n : heavy_count(p, order, kfloor));
  // The floor is a budget too: draws fill it up if the target alone would not.
  auto floor_draws = [&]() { return static_cast<double>(kfloor > t ? kfloor - t : 0); };
  double V = 0.0, need = 0.0;
  if (!exact_all) draw_to(std::min<uint64_t>(kPilotDraws, cap - t));
  for (int growths = 0; !exact_all && sampler.total > 0.0;) {
    V = mo.relative_variance(exact);
    need = std::max(ceil(c * V / eps2), floor_draws());
    const uint64_t have = acc.size(), room = cap - t;
    if (need <= static_cast<double>(have) || have >= room) break;  // met, or at the cap
    if (need > static_cast<double>(kcur - t) && growths < kMaxGrowths) {
      // The method's split of the current budget cannot hold the draws needed:
      // a larger budget, and with it a larger heavy set.
      const uint64_t k = search_budget(p, order, kcur, cap, acc.size(), c, V, eps2, sampler.total / W);
      ++growths;
      // Small steps re-estimate on nearly the same draws and creep: draw instead.
      if (k >= kcur + std::max<uint64_t>(kcur / 8, 16)) {
        kcur = k;
        exact_all = kcur >= n;
        grow_heavy(exact_all ? n : heavy_count(p, order, kcur));
        if (!exact_all) draw_to(std::min<uint64_t>(std::max<uint64_t>(acc.size(), kEstimateDraws), cap - t));
        continue;
      }
    }
    // Sequential draws: every draw's row is read for the output anyway, so the
    // variance is re-estimated on all draws so far as they grow (a pilot of tens
    // of draws underestimates a heavy-tailed variance more often than not); each
    // step draws towards the current need, but at least a quarter more.
    const uint64_t goal = std::max<uint64_t>(need < static_cast<double>(room) ? static_cast<uint64_t>(need) : room,
                                             have + std::max<uint64_t>(have / 4, 1));
    draw_to(std::min(goal, room));
  }
  const auto t_chosen = Clock::now();

  for (size_t i = 0; i < t; ++i) {
    out->tokens.push_back(base + order.at(i));
    out->log_pi.push_back(0.0f);
  }
  out->heavy = t;
  uint64_t m = 0;
  if (!exact_all && sampler.total > 0.0) {
    V = mo.relative_variance(exact);
    m = acc.size();
    outcome->capped = !(ceil(c * V / eps2) <= static_cast<double>(m));
    outcome->predicted_error = m > 0 ? sqrt(c * V / static_cast<double>(m)) : INFINITY;
    std::sort(acc.begin(), acc.end());
    acc.erase(std::unique(acc.begin(), acc.end()), acc.end());
    const double md = static_cast<double>(m);
    for (uint32_t j : acc) {
      const double pj = static_cast<double>(w[j]) / sampler.total;
      out->tokens.push_back(base + j);
      out->log_pi.push_back(static_cast<float>(log(inclusion_probability(pj, md, p.pi_min))));
    }
    out->unique = acc.size();
  }
  out->draws = m;
  out->residual_mass = exact_all ? 0.0 : sampler.total / W;
  outcome->budget = p.fixed_tokens + t + m;
  out->heavy_seconds = std::chrono::duration<double>(t_chosen - t_begin).count();
  out->sampling_seconds = std::chrono::duration<double>(Clock::now() - t_chosen).count();
}

}  // namespace ssa
