// Error-targeted decode on the GPU (ssa.h "Error-targeted decode"; the design is
// docs/ALGORITHM.md, "On CUDA sessions"). The kernel pipeline takes one budget
// per launch set, so the budgets grow in rounds driven by the host:
//   round 0 decodes at the floor budget, at least large enough for a pilot of
//     64 draws (the method's own split of k' into heavy rows and draws);
//   after each round, kernels/error_estimate.cu computes every q head's V (the
//     relative variance per draw, lib/select/error_target.cc's formula) from the
//     rows that round read, and the host reads V and the row states back;
//   a head whose c V / eps^2 draws are no more than the round drew keeps that
//     round's output (its prediction comes from the draws that produced it);
//   the heads still short decode again, all at the largest budget any of them
//     asks for (the split that gives 1.25x its need, at least 1.5x the last
//     budget), so a head is decided in the first round that meets it;
//   the fourth round, or any round at max_budget, is the last: heads still short
//     keep its output at the cap and are counted in capped_heads.
// A round's budget that covers every candidate decodes them all (exact). Every
// round redraws from the same Philox streams, so everything is a function of
// (seed, step, inputs). Four rounds bound the host round trips (a few tens of
// microseconds each) and the repeated scoring; one pilot plus two informed
// rounds nearly always meet the target (the estimate of V only tightens), and
// the fourth goes straight to the cap so that no head ends neither met nor capped.
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend.h"
#include "device_error.h"
#include "device_mem.h"
#include "kernels/error_estimate.h"
#include "launch_set.h"
#include "select/error_bound.h"
#include "select/selection.h"
#include "session.h"
#include "status.h"

namespace ssa::cuda {
namespace {

constexpr uint64_t kPilotDraws = 64;
// Fewest draws a met target is accepted from (a variance from a handful of
// draws is too rough); rows with no residual weight are exact and need none.
constexpr uint64_t kMinAcceptDraws = 32;
constexpr int kMaxRounds = 4;
constexpr double kDrawMargin = 1.25;
constexpr double kMinGrowth = 1.5;
// SSA_ADAPTIVE decides its heavy set on the device: a round's draw share of its
// budget predicts the next one's, at least this.
constexpr double kMinDrawShare = 1.0 / 16;

thread_local uint32_t t_last_rounds = 0;

// Reads back, after a round, every row's state and V.
class EstimateHook final : public LaunchHook {
 public:
  std::vector<RowState> rows;
  std::vector<double> V;
  bool sparse = false;

  bool record_draws() const override { return true; }
  cudaError_t after_decode(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                           cudaStream_t stream) override {
    sparse = b.proxy != Proxy::kNone;
    if (!sparse) return cudaSuccess;
    const size_t scratch = estimate_scratch_bytes(b, plan);
    cudaError_t e = mem_.alloc(scratch + size_t{plan.rows} * sizeof(double), stream);
    if (e != cudaSuccess) return e;
    double* v_dev = reinterpret_cast<double*>(static_cast<uint8_t*>(mem_.p) + scratch);
    if ((e = launch_error_estimate(b, plan, ws, mem_.p, v_dev, stream)) != cudaSuccess) return e;
    rows.resize(plan.rows);
    V.resize(plan.rows);
    if ((e = cudaMemcpyAsync(rows.data(), ws.rows, rows.size() * sizeof(RowState), cudaMemcpyDeviceToHost,
                             stream)) != cudaSuccess)
      return e;
    return cudaMemcpyAsync(V.data(), v_dev, V.size() * sizeof(double), cudaMemcpyDeviceToHost, stream);
  }

 private:
  DeviceMem mem_;  // scratch (split partials) and V, freed on the stream after the copies
};

// What one head's output came from (the stats of the round it kept).
struct HeadOutcome {
  bool decided = false, capped = false, exact = false;
  RowState row{};
  double predicted = 0.0;
};

// Smallest k' (from `from`, below `cap`) whose fixed-fraction split leaves
// `draws` draws; cap if none does.
uint64_t budget_for_draws(const ssa_decode_params& p, uint64_t draws, uint64_t from, uint64_t cap) {
  const double share = 1.0 - static_cast<double>(p.heavy_fraction);
  uint64_t k = std::max<uint64_t>(from, static_cast<uint64_t>(ceil(static_cast<double>(draws) / share)));
  while (k < cap && k - fixed_heavy_count(p.method, k, p.heavy_fraction) < draws) ++k;
  return std::min(k, cap);
}

}  // namespace

uint32_t last_targeted_rounds() { return t_last_rounds; }

absl::Status targeted_decode(const LaunchJob& job, uint32_t layer_index, const ssa_decode_params& p,
                             uint64_t seed, ssa_decode_stats* stats) {
  const DecodePlan& plan = job.plan;
  const ssa_session& s = *job.s;
  const uint32_t nq = s.layout.n_q_heads;
  t_last_rounds = 1;
  if (plan.dense || !plan.selects()) {
    // Everything exact (the floor covers the candidates), or the cap leaves only
    // sink and local tokens: their share of the output is lost and no draw can
    // measure it. One ordinary decode, as on the CPU.
    LaunchJob j = job;
    j.plan.targeted = false;
    SSA_RETURN_IF_ERROR(run_launch_set({j}, layer_index, p, seed, stats));
    if (stats != nullptr) {
      stats->target_budget += uint64_t{nq} * (plan.dense ? plan.n : plan.fixed_tokens());
      if (!plan.dense) {
        stats->capped_heads += nq;
        stats->predicted_error = INFINITY;
      }
    }
    return absl::OkStatus();
  }
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const bool staged = host_buffers(s);
  const size_t head_bytes = s.layout.row_bytes(), out_bytes = size_t{nq} * head_bytes;
  const bool adaptive = p.method == SSA_METHOD_SSA_ADAPTIVE;
  const uint64_t nc = plan.candidates();
  const uint64_t kcap = std::min(plan.kprime_cap, nc);
  const uint64_t kfloor = std::min(plan.kprime, kcap);
  const double c = confidence_factor(p.target_delta);
  const double eps2 = static_cast<double>(p.target_error) * p.target_error;

  // Each round writes here; a decided head's rows are copied to the caller's out.
  std::vector<uint8_t> host_round;
  DeviceMem dev_round;
  void* round_out = nullptr;
  if (staged) {
    host_round.resize(out_bytes);
    round_out = host_round.data();
  } else {
    SSA_CUDA_RETURN(dev_round.alloc(out_bytes, stream), "cudaMallocAsync of the round output");
    round_out = dev_round.p;
  }
  auto keep_head = [&](uint32_t h) -> absl::Status {
    uint8_t* dst = static_cast<uint8_t*>(job.out) + h * head_bytes;
    const uint8_t* src = static_cast<const uint8_t*>(round_out) + h * head_bytes;
    if (staged) {
      memcpy(dst, src, head_bytes);
      return absl::OkStatus();
    }
    SSA_CUDA_RETURN(cudaMemcpyAsync(dst, src, head_bytes, cudaMemcpyDeviceToDevice, stream), "head output copy");
    return absl::OkStatus();
  };

  uint64_t k = adaptive ? std::max<uint64_t>(kfloor, 2 * kPilotDraws)
                        : budget_for_draws(p, kPilotDraws, kfloor, kcap);
  k = std::min(k, kcap);
  std::vector<HeadOutcome> heads(nq);
  uint64_t rows_from_host = 0, host_cache_hits = 0;
  for (int round = 0; round < kMaxRounds; ++round) {
    if (round == kMaxRounds - 1) k = kcap;
    const bool last = k >= kcap;
    LaunchJob j = job;
    j.out = round_out;
    j.plan.targeted = false;
    j.plan.kprime = k;
    j.plan.dense = k >= nc;
    EstimateHook hook;
    ssa_decode_stats rs{};
    rs.struct_size = sizeof(rs);
    t_last_rounds = static_cast<uint32_t>(round + 1);
    SSA_RETURN_IF_ERROR(run_launch_set({j}, layer_index, p, seed, stats != nullptr ? &rs : nullptr, &hook));
    rows_from_host += rs.rows_from_host;
    host_cache_hits += rs.host_cache_hits;
    uint64_t next = 0;
    bool pending = false;
    for (uint32_t h = 0; h < nq; ++h) {
      HeadOutcome& o = heads[h];
      if (o.decided) continue;
      if (!hook.sparse) {  // every candidate read: exact
        o.decided = o.exact = true;
        SSA_RETURN_IF_ERROR(keep_head(h));
        continue;
      }
      const RowState& st = hook.rows[h];
      const double V = hook.V[h];
      const uint64_t m = st.n_draws;
      const double need = ceil(c * V / eps2);  // +inf when V is
      const bool met = V == 0.0 || (need <= static_cast<double>(m) && m >= kMinAcceptDraws);
      if (met || last) {
        o.decided = true;
        o.capped = !met;
        o.row = st;
        o.predicted = V == 0.0 ? 0.0 : m > 0 ? sqrt(c * V / static_cast<double>(m)) : INFINITY;
        SSA_RETURN_IF_ERROR(keep_head(h));
        continue;
      }
      pending = true;
      // The budget this head asks for next: its need (with a margin) in draws.
      const double want = std::max(need, static_cast<double>(kPilotDraws)) * kDrawMargin;
      uint64_t kh;
      if (!std::isfinite(want)) {
        kh = kcap;
      } else if (adaptive) {
        const double share = std::max(kMinDrawShare, static_cast<double>(m) / static_cast<double>(k));
        kh = static_cast<uint64_t>(std::min(ceil(want / share), static_cast<double>(kcap)));
      } else {
        kh = budget_for_draws(p, static_cast<uint64_t>(std::min(want, static_cast<double>(kcap))), k, kcap);
      }
      next = std::max(next, kh);
    }
    if (!pending) break;
    next = std::max(next, static_cast<uint64_t>(ceil(static_cast<double>(k) * kMinGrowth)));
    k = std::min(next, kcap);
  }
  // The copies into out are queued on the stream; the round buffer is freed after them.
  if (stats != nullptr) {
    const uint64_t always = plan.fixed_tokens();
    stats->context_tokens += plan.n;
    stats->rows_from_host += rows_from_host;
    stats->host_cache_hits += host_cache_hits;
    for (const HeadOutcome& o : heads) {
      stats->scored_tokens += nc;
      if (o.exact) {
        stats->tokens_read += plan.n;
        stats->heavy_tokens += nc;
        stats->target_budget += plan.n;
        continue;
      }
      const RowState& r = o.row;
      stats->tokens_read += always + r.n_heavy + r.n_unique;
      stats->heavy_tokens += r.n_heavy;
      stats->draws += r.n_draws;
      stats->unique_samples += r.n_unique;
      const double total = r.w_resid_proxy + r.w_heavy;
      stats->residual_proxy_mass += total > 0 ? r.w_resid_proxy / total : 0.0;
      stats->target_budget += always + r.n_heavy + r.n_draws;
      stats->capped_heads += o.capped ? 1 : 0;
      stats->predicted_error += o.predicted;
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa::cuda
