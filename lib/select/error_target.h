// Error-targeted selection for one query head: instead of a budget, the caller
// gives a relative error epsilon and a confidence 1 - delta, and the head picks
// the smallest budget whose predicted error meets them (ssa.h has the contract).
//
// Estimator and its variance. With E the rows read exactly (sink, local, heavy
// set H; their softmax sums Z_E and Y_E = sum w v) and m i.i.d. draws i_j from
// the residual R with proxy probabilities p, the output is the ratio
//     o_hat = (Y_E + Y_R_hat) / (Z_E + Z_R_hat).
// Linearised around o (delta method), o_hat - o ~= (1/m) sum_j u_j / Z with
// u_j = (w_i / p_i)(v_i - o), Z = Z_E + Z_R: so E||o_hat - o||^2 ~= S^2 / (m Z^2),
// S^2 = the per-draw variance of u summed over the head dimension. That is the
// with-replacement (Hansen-Hurwitz) variance; the decode's deduplicated
// Horvitz-Thompson estimator has at most about that much, so the prediction is
// conservative. The draws estimate S^2, Z and o; the relative variance
// per draw is V = S^2 / (Z^2 ||o||^2), and m >= c(delta) V / epsilon^2 draws meet
// the target with c from error_bound.h.
//
// Choosing the budget. Draws are cheap only while the heavy set is right, so the
// budget k' (for the middle candidates) is grown and split by the method's own
// rule (fixed fraction h, or water-filling for SSA_ADAPTIVE). For a candidate k',
// V is predicted from the current estimate by scaling with the squared proxy
// residual mass, V(k') = V * (A(k') / A)^2 (the residual's share of the output
// scales with its mass); the smallest k' whose split leaves enough draws is taken
// (exponential then binary search), the new heavy rows are read, and V is
// estimated again on the new residual. Once the split holds the draws needed (or
// the growths are spent), draws continue sequentially: every draw's row is read
// for the output anyway, so V is re-estimated on all draws so far until their
// number meets c V / epsilon^2 or the cap.
//
// Reuse and determinism. Draw j always uses counter j of the head's RNG stream;
// the pilot is the first draws, later draws continue the stream. Pilot draws that
// land in a grown heavy set are read as heavy rows; the others are draws from the
// new residual conditioned on missing the new heavy tokens, i.e. exactly draws
// from the new residual distribution, so every row read enters the estimate.
// Nothing depends on threads or timing.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "common/philox.h"
#include "selection.h"
#include "ssa.h"

namespace ssa {

// Exact logits and values of single rows of one head, read by the caller.
class ExactRows {
 public:
  virtual ~ExactRows() = default;
  virtual uint32_t head_dim() const = 0;
  // The logit of `token` (absolute index) in attention-logit units; its value
  // row goes to v[0..head_dim).
  virtual double read(uint32_t token, float* v) const = 0;
};

// Online-softmax sums in double of rows read exactly: z = sum exp(s - m),
// y = sum exp(s - m) v.
struct ExactSum {
  double m = -INFINITY, z = 0.0;
  std::vector<double> y;
  void add(double logit, const float* v, uint32_t d);
};

struct TargetParams {
  ssa_method method;     // SSA or SSA_ADAPTIVE
  float heavy_fraction;  // h (SSA)
  float pi_min;
  uint64_t kprime_floor; // smallest budget for the candidates
  uint64_t kprime_cap;   // largest budget for the candidates
  uint64_t fixed_tokens; // sink + local, only for the reported budget
  double epsilon, delta;
};

struct TargetOutcome {
  uint64_t budget = 0;          // fixed_tokens + |H| + draws
  bool capped = false;          // the cap stopped the head short of its target
  double predicted_error = 0.0; // predicted relative error at confidence 1 - delta
};

// proxy: candidate scores (candidate j is token base + j), n > 0 of them.
// fixed: the exact sums of the always-read rows (sink, local). Fills *out (heavy
// tokens with log pi 0, then unique draws) and *outcome.
void select_targeted(const TargetParams& p, const float* proxy, size_t n, uint32_t base,
                     const ExactRows& rows, const ExactSum& fixed, const RngStream& rng,
                     SelectScratch& scratch, Selection* out, TargetOutcome* outcome);

}  // namespace ssa
