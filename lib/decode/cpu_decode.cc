#include "cpu_decode.h"

#include <math.h>

#include <algorithm>
#include <chrono>

#include "common/dtype.h"
#include "common/philox.h"
#include "cpu/attention.h"
#include "cpu/simd.h"
#include "candidate_scores.h"
#include "decode_buffers.h"
#include "decode_plan.h"
#include "fixed_splits.h"
#include "shard/sharded_decode.h"
#include "split_attention.h"
#include "select/error_target.h"
#include "select/group_proposal.h"
#include "select/selection.h"

namespace ssa {
namespace {

struct HeadStats {
  uint64_t read = 0, heavy = 0, draws = 0, unique = 0, scored = 0;
  double residual = 0.0;
  TargetOutcome target;  // error-targeted decodes only
  DecodeProfile time;
};

// Single rows of one KV head for the error-targeted selection: the exact logit
// for a (pre-scaled) query and the value, widened to float.
class StoreRows final : public ExactRows {
 public:
  StoreRows(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q)
      : layout_(layout), layer_(layer), kv_head_(kv_head), q_(q) {}
  uint32_t head_dim() const override { return layout_.head_dim; }
  double read(uint32_t token, float* v) const override {
    const auto& kern = simd::kernels();
    const uint32_t P = layout_.page_tokens;
    const uint8_t* page = layer_.kv_pages[token / P]->data();
    kern.to_f32(layout_.dtype, page + layout_.v_offset(kv_head_, token % P), v, layout_.head_dim);
    return kern.dot(layout_.dtype, page + layout_.k_offset(kv_head_, token % P), q_, layout_.head_dim);
  }

 private:
  const KvLayout& layout_;
  const LayerStore& layer_;
  uint32_t kv_head_;
  const float* q_;
};

// Exact sums of the sink and local rows (error-targeted selection needs them).
ExactSum fixed_rows_sum(const StoreRows& rows, const DecodePlan& plan) {
  ExactSum sum;
  std::vector<float> v(rows.head_dim());
  auto add = [&](uint64_t t0, uint64_t t1) {
    for (uint64_t t = t0; t < t1; ++t) {
      sum.add(rows.read(static_cast<uint32_t>(t), v.data()), v.data(), rows.head_dim());
    }
  };
  add(0, plan.sink_end);
  add(plan.local_begin, plan.n);
  return sum;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Scores of the candidates for query q: exact for the oracle, else the PQ proxy.
void candidate_scores(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                      const DecodePlan& plan, ssa_method method, std::vector<float>* lut, float* scores) {
  score_tokens(layout, layer, kv_head, q, method, plan.sink_end, plan.local_begin, lut, scores);
}

void append_range(uint64_t t0, uint64_t t1, HeadTrace* trace) {
  for (uint64_t t = t0; t < t1; ++t) {
    trace->tokens.push_back(static_cast<uint32_t>(t));
    trace->log_pi.push_back(0.0f);
  }
}

// Stages 1-3 for one query head: proxy scores, heavy set, residual samples.
// `scored`: the head's scores when its KV group scored them together (then
// `score_seconds` is its share of that time), else null.
HeadStats select_head(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                      uint32_t q_head, const float* q, const DecodePlan& plan,
                      const ssa_decode_params& p, uint64_t seed, Selection* sel,
                      const float* scored = nullptr, double score_seconds = 0.0) {
  const KvLayout& layout = s.layout;
  const uint32_t kv_head = q_head / layout.group_size();
  thread_local std::vector<float> own_scores, lut;
  thread_local SelectScratch scratch;
  HeadStats st;
  sel->clear();
  if (plan.selects()) {
    const uint64_t nc = plan.candidates();
    const float* scores = scored;
    if (scores == nullptr) {
      const auto t_score = Clock::now();
      own_scores.resize(nc);
      candidate_scores(layout, layer, kv_head, q, plan, p.method, &lut, own_scores.data());
      st.time.scoring = seconds_since(t_score);
      scores = own_scores.data();
    } else {
      st.time.scoring = score_seconds;
    }
    const RngStream rng = make_rng_stream(seed, p.step, layer_index, q_head);
    if (plan.targeted) {
      const StoreRows rows(layout, layer, kv_head, q);
      const TargetParams tp{p.method,        p.heavy_fraction,     p.pi_min,
                            plan.kprime,     plan.kprime_cap,      plan.fixed_tokens(),
                            p.target_error,  p.target_delta};
      select_targeted(tp, scores, nc, static_cast<uint32_t>(plan.sink_end), rows,
                      fixed_rows_sum(rows, plan), rng, scratch, sel, &st.target);
    } else {
      const SelectParams sp{p.method, plan.kprime, p.heavy_fraction, p.pi_min};
      select_tokens(sp, scores, nc, static_cast<uint32_t>(plan.sink_end), rng, scratch, sel);
    }
    st.scored = nc;
    st.time.heavy = sel->heavy_seconds;
    st.time.sampling = sel->sampling_seconds;
  }
  st.read = plan.fixed_tokens() + sel->tokens.size();
  if (plan.targeted && !plan.selects()) {
    // The cap leaves nothing for the candidates: their share of the output is lost
    // and no draw can measure it.
    st.target.budget = plan.fixed_tokens();
    st.target.capped = true;
    st.target.predicted_error = INFINITY;
  }
  st.heavy = sel->heavy;
  st.draws = sel->draws;
  st.unique = sel->unique;
  st.residual = sel->residual_mass;
  return st;
}

// Whether per-head selection runs a task per KV head, scoring the group's heads
// in one pass over the codes: when there are KV heads enough to keep every
// thread busy (else a task per query head balances better), the heads share a
// KV head, and the decode is not error-targeted (its selection reads rows too).
bool group_tasks(const KvLayout& layout, const DecodePlan& plan, const ssa_decode_params& p, ThreadPool& pool) {
  return plan.selects() && !plan.targeted && layout.group_size() > 1 &&
         layout.n_kv_heads >= static_cast<uint32_t>(pool.num_threads());
}

// Stages 1-3 once for the g query heads of one KV head (group selection): the
// group proposal's logits, one heavy set and one sample with the group's budget
// g * k', copied to every head of the group, which reweights all of the shared
// rows by their shared inclusion probabilities (docs/GROUP_SELECTION.md).
void select_group(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                  uint32_t kv_head, const float* q, const DecodePlan& plan,
                  const ssa_decode_params& p, uint64_t seed, Selection* sels, HeadStats* hst) {
  const KvLayout& layout = s.layout;
  const uint32_t g = layout.group_size(), d = layout.head_dim;
  const float* qg = q + size_t{kv_head} * g * d;
  const uint64_t nc = plan.candidates();
  thread_local std::vector<float> scores, logits, lut, qmean;
  thread_local SelectScratch scratch;
  HeadStats st;
  Selection& sel = sels[0];
  sel.clear();
  const auto t_score = Clock::now();
  auto score = [&](const float* qh, float* out) {
    candidate_scores(layout, layer, kv_head, qh, plan, p.method, &lut, out);
  };
  const uint64_t kprime = plan.kprime * g;
  if (!plan.selects()) {
    // The budget covers only sink and local tokens: nothing is scored or chosen.
  } else if (kprime >= nc) {
    // The group's budget covers every candidate: all of them, exactly.
    for (uint64_t t = plan.sink_end; t < plan.local_begin; ++t) {
      sel.tokens.push_back(static_cast<uint32_t>(t));
      sel.log_pi.push_back(0.0f);
    }
    sel.heavy = nc;
  } else {
    logits.resize(nc);
    uint64_t scored = nc;
    if (p.group_selection == SSA_GROUP_MEAN_QUERY) {
      qmean.resize(d);
      mean_query(qg, g, d, qmean.data());
      score(qmean.data(), logits.data());
    } else {
      scores.resize(nc * g);
      std::vector<const float*> rows(g);
      std::vector<float> head_max(g);
      std::vector<uint64_t> head_total(g);
      thread_local std::vector<std::vector<float>> luts;
      score_tokens_group(layout, layer, kv_head, qg, g, p.method, plan.sink_end, plan.local_begin, &luts,
                         scores.data(), nc);
      for (uint32_t j = 0; j < g; ++j) {
        rows[j] = scores.data() + j * nc;
        head_max[j] = simd::kernels().max_value(rows[j], nc);
        head_total[j] = proposal_total(rows[j], nc, head_max[j]);
      }
      mixture_logits(rows.data(), g, nc, head_max.data(), head_total.data(), logits.data());
      scored = nc * g;
    }
    st.time.scoring = seconds_since(t_score);
    st.scored = scored;
    // Keyed by the group's first query head: a group of one draws exactly what
    // its head draws without group selection.
    const RngStream rng = make_rng_stream(seed, p.step, layer_index, kv_head * g);
    const SelectParams sp{p.method, kprime, p.heavy_fraction, p.pi_min};
    select_tokens(sp, logits.data(), nc, static_cast<uint32_t>(plan.sink_end), rng, scratch, &sel);
    st.time.heavy = sel.heavy_seconds;
    st.time.sampling = sel.sampling_seconds;
  }
  st.read = plan.fixed_tokens() + sel.tokens.size();
  st.heavy = sel.heavy;
  st.draws = sel.draws;
  st.unique = sel.unique;
  st.residual = sel.residual_mass;
  // Every head uses all of the group's rows; the work (scores computed, stage
  // times) is counted once, on the group's first head.
  hst[0] = st;
  for (uint32_t j = 1; j < g; ++j) {
    sels[j] = sel;
    hst[j] = st;
    hst[j].scored = 0;
    hst[j].time = DecodeProfile{};
  }
}

// Stage 4 for all heads: partials over the fixed splits (lib/decode/split_attention.h)
// of sink, local and selected rows, merged in split order.
void attend_selected(const ssa_session& s, const LayerStore& layer, const float* q,
                     const DecodePlan& plan, DecodeBuffers& buf, bool shared, std::vector<AttnPartial>* heads) {
  sparse_split_partials(s.layout, layer, 0, plan, q, buf.sels, shared, *s.rt->pool, &buf.split, &buf.parts);
  merge_split_partials(s.layout, buf.parts, splits_for(layer.n_tokens), heads);
}

void trace_selection(const DecodePlan& plan, const Selection& sel, HeadTrace* trace) {
  trace->tokens.clear();
  trace->log_pi.clear();
  append_range(0, plan.sink_end, trace);
  append_range(plan.local_begin, plan.n, trace);
  trace->tokens.insert(trace->tokens.end(), sel.tokens.begin(), sel.tokens.end());
  trace->log_pi.insert(trace->log_pi.end(), sel.log_pi.begin(), sel.log_pi.end());
}

}  // namespace

absl::Status cpu_decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                              const void* q_in, void* out, const ssa_decode_params& p,
                              uint64_t seed, ssa_decode_stats* stats,
                              std::vector<HeadTrace>* traces, DecodeProfile* profile) {
  if (runtime_sharded(*s.rt)) {
    return sharded_decode_layer(s, layer, layer_index, q_in, out, p, seed, stats, traces);
  }
  const KvLayout& layout = s.layout;
  const uint32_t d = layout.head_dim, nq = layout.n_q_heads, g = layout.group_size();
  ThreadPool& pool = *s.rt->pool;

  // Queries as float, pre-multiplied by 1/sqrt(d): every score is then directly
  // in attention-logit units (proxy and exact alike).
  std::vector<float> q(size_t{nq} * d);
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  for (size_t i = 0; i < q.size(); ++i) q[i] = load_as_f32(q_in, layout.dtype, i) * scale;

  const DecodePlan plan = plan_decode(layer.n_tokens, p);
  std::vector<AttnPartial> heads(nq);
  std::vector<HeadStats> hstats(nq);
  if (traces != nullptr) traces->assign(nq, HeadTrace{});

  const DecodeBufferPool::Lease buf = s.rt->decode_buffers->acquire();
  const auto t_start = Clock::now();
  if (plan.dense) {
    dense_split_partials(layout, layer, q.data(), pool, &buf->parts);
    merge_split_partials(layout, buf->parts, splits_for(plan.n), &heads);
    for (uint32_t h = 0; h < nq; ++h) {
      hstats[h].read = plan.n;
      if (plan.targeted) hstats[h].target.budget = plan.n;
      if (traces != nullptr) append_range(0, plan.n, &(*traces)[h]);
    }
    if (profile != nullptr) profile->attention += seconds_since(t_start);
  } else {
    std::vector<Selection>& sels = buf->sels;
    sels.resize(nq);
    for (Selection& sel : sels) sel.clear();  // a kept set's capacity, not its contents
    if (p.group_selection != SSA_GROUP_OFF) {
      pool.parallel_for(layout.n_kv_heads, [&](size_t kv) {
        select_group(s, layer, layer_index, static_cast<uint32_t>(kv), q.data(), plan, p, seed,
                     &sels[kv * g], &hstats[kv * g]);
        for (uint32_t j = 0; traces != nullptr && j < g; ++j) {
          trace_selection(plan, sels[kv * g + j], &(*traces)[kv * g + j]);
        }
      });
    } else if (group_tasks(layout, plan, p, pool)) {
      // A task per KV head: its heads' scores in one pass over the codes, then
      // each head's selection (the same scores and selections as a task per head).
      pool.parallel_for(layout.n_kv_heads, [&](size_t kv) {
        thread_local std::vector<float> scores;
        thread_local std::vector<std::vector<float>> luts;
        const uint64_t nc = plan.candidates();
        scores.resize(nc * g);
        const auto t_score = Clock::now();
        score_tokens_group(layout, layer, static_cast<uint32_t>(kv), q.data() + kv * g * d, g, p.method,
                           plan.sink_end, plan.local_begin, &luts, scores.data(), nc);
        const double share = seconds_since(t_score) / g;
        for (uint32_t j = 0; j < g; ++j) {
          const size_t h = kv * g + j;
          hstats[h] = select_head(s, layer, layer_index, static_cast<uint32_t>(h), q.data() + h * d, plan, p,
                                  seed, &sels[h], scores.data() + j * nc, share);
          if (traces != nullptr) trace_selection(plan, sels[h], &(*traces)[h]);
        }
      });
    } else {
      pool.parallel_for(nq, [&](size_t h) {
        hstats[h] = select_head(s, layer, layer_index, static_cast<uint32_t>(h), q.data() + h * d, plan,
                                p, seed, &sels[h]);
        if (traces != nullptr) trace_selection(plan, sels[h], &(*traces)[h]);
      });
    }
    const auto t_attn = Clock::now();
    attend_selected(s, layer, q.data(), plan, *buf, p.group_selection != SSA_GROUP_OFF, &heads);
    if (profile != nullptr) profile->attention += seconds_since(t_attn) * pool.num_threads();
  }

  std::vector<float> o(d);
  for (uint32_t h = 0; h < nq; ++h) {
    heads[h].finish(o.data());
    for (uint32_t i = 0; i < d; ++i) store_from_f32(out, layout.dtype, size_t{h} * d + i, o[i]);
  }
  if (profile != nullptr && !plan.dense) {
    for (const HeadStats& hs : hstats) {
      profile->scoring += hs.time.scoring;
      profile->heavy += hs.time.heavy;
      profile->sampling += hs.time.sampling;
    }
  }
  if (stats != nullptr) {
    stats->context_tokens += plan.n;
    if (plan.window_only()) stats->window_only_heads += nq;
    for (const HeadStats& hs : hstats) {
      stats->tokens_read += hs.read;
      stats->heavy_tokens += hs.heavy;
      stats->draws += hs.draws;
      stats->unique_samples += hs.unique;
      stats->residual_proxy_mass += hs.residual;
      stats->scored_tokens += hs.scored;
      stats->target_budget += hs.target.budget;
      stats->capped_heads += hs.target.capped ? 1 : 0;
      stats->predicted_error += hs.target.predicted_error;
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa
