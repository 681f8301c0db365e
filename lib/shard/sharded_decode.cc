#include "sharded_decode.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "backend.h"
#include "common/dtype.h"
#include "cpu/simd.h"
#include "decode/candidate_scores.h"
#include "decode/decode_plan.h"
#include "decode/fixed_splits.h"
#include "decode/split_attention.h"
#include "callback_collective.h"
#include "group_call_check.h"
#include "in_process_collective.h"
#include "select/fixed_point_sampler.h"
#include "select/group_proposal.h"
#include "select/radix_topk.h"
#include "select/selection.h"
#include "shard_map.h"
#include "sharded_topk.h"
#include "status.h"

namespace ssa {
namespace {

bool samples_residual(ssa_method m) {
  return m == SSA_METHOD_SSA || m == SSA_METHOD_SAMPLING || m == SSA_METHOD_HYBRID_UNIFORM ||
         m == SSA_METHOD_SSA_ADAPTIVE;
}

// What every rank reads; the ranks write only their own slots, rank 0 the output.
struct Shared {
  const ssa_session& s;
  const LayerStore& layer;
  uint32_t layer_index;
  const ssa_decode_params& p;
  uint64_t seed;
  DecodePlan plan;
  std::vector<float> q;  // pre-scaled queries, [n_q_heads][head_dim]
  std::vector<ShardRange> ranges;
  std::vector<AttnPartial> heads;  // merged by rank 0 (by every rank of a process group)
  bool every_rank_reports = false;  // a process group: each rank returns the output and stats
  // Per selection unit (a query head, or a KV head with group selection), the
  // global values rank 0 reports in the stats.
  std::vector<uint64_t> heavy, unique, draws;
  std::vector<double> residual;
  // Traced decodes: every rank's selections (in its view's indices), one slot per rank.
  std::vector<std::vector<Selection>>* rank_sels = nullptr;
};

// One unit's selection on this rank: the candidates [ca, cb) it holds.
struct Unit {
  uint32_t kv = 0;
  uint64_t kprime = 0;
  RngStream rng{};
  bool all = false;        // a group whose budget covers every candidate
  std::vector<float> logits;  // over this rank's candidates
  std::vector<float> e;       // proposal, then residual weights
  FixedHierarchy hierarchy;
};

// This rank's part of the selection of every unit: heavy rows and samples into
// sels (tokens of the shard's own indices).
absl::Status select_units(Shared& sh, Collective& comm, const LayerStore& view, std::vector<Selection>* sels) {
  const ssa_session& s = sh.s;
  const KvLayout& layout = s.layout;
  const ssa_decode_params& p = sh.p;
  const DecodePlan& plan = sh.plan;
  ThreadPool& pool = *s.rt->pool;
  const uint32_t rank = comm.rank(), R = comm.size();
  const uint32_t d = layout.head_dim, g = layout.group_size();
  const bool grouped = p.group_selection != SSA_GROUP_OFF;
  const size_t U = grouped ? layout.n_kv_heads : layout.n_q_heads;
  const ShardRange range = sh.ranges[rank];
  const uint64_t nc = plan.candidates();
  const uint64_t ca = std::max(range.begin, plan.sink_end), cb = std::min(range.end, plan.local_begin);
  const size_t nl = ca < cb ? static_cast<size_t>(cb - ca) : 0;
  const uint64_t v0 = nl > 0 ? ca - range.begin : 0;  // first candidate in the view's indices
  const ssa_method method = p.method;

  std::vector<Unit> units(U);
  for (size_t u = 0; u < U; ++u) {
    Unit& un = units[u];
    un.kv = grouped ? static_cast<uint32_t>(u) : static_cast<uint32_t>(u) / g;
    un.kprime = grouped ? plan.kprime * g : plan.kprime;
    un.rng = make_rng_stream(sh.seed, p.step, sh.layer_index,
                             grouped ? static_cast<uint32_t>(u) * g : static_cast<uint32_t>(u));
    un.all = grouped && un.kprime >= nc;
  }
  // Stage 1: the proposal's logits over this rank's candidates.
  if (!grouped || p.group_selection == SSA_GROUP_MEAN_QUERY) {
    pool.parallel_for(U, [&](size_t u) {
      Unit& un = units[u];
      if (un.all) return;
      thread_local std::vector<float> lut, qmean;
      const float* qu = sh.q.data() + u * d;
      if (grouped) {
        qmean.resize(d);
        mean_query(sh.q.data() + size_t{un.kv} * g * d, g, d, qmean.data());
        qu = qmean.data();
      }
      un.logits.resize(nl);
      score_tokens(layout, view, un.kv, qu, method, v0, v0 + nl, &lut, un.logits.data());
    });
  } else {
    // Mixture: every head's softmax over all candidates (global max, global
    // normaliser), then the mixture's logit of each of this rank's tokens.
    std::vector<std::vector<float>> scores(U);
    std::vector<float> hmax(U * g, -INFINITY);
    pool.parallel_for(U, [&](size_t u) {
      if (units[u].all) return;
      thread_local std::vector<float> lut;
      scores[u].resize(size_t{g} * nl);
      for (uint32_t j = 0; j < g; ++j) {
        float* row = scores[u].data() + j * nl;
        score_tokens(layout, view, units[u].kv, sh.q.data() + (size_t{units[u].kv} * g + j) * d, method, v0,
                     v0 + nl, &lut, row);
        hmax[u * g + j] = simd::kernels().max_value(row, nl);
      }
    });
    SSA_RETURN_IF_ERROR(comm.all_reduce_max(hmax.data(), hmax.size()));
    std::vector<uint64_t> htotal(U * g, 0);
    pool.parallel_for(U, [&](size_t u) {
      if (units[u].all) return;
      for (uint32_t j = 0; j < g; ++j) {
        htotal[u * g + j] = proposal_total(scores[u].data() + j * nl, nl, hmax[u * g + j]);
      }
    });
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(htotal.data(), htotal.size()));
    pool.parallel_for(U, [&](size_t u) {
      if (units[u].all) return;
      std::vector<const float*> rows(g);
      for (uint32_t j = 0; j < g; ++j) rows[j] = scores[u].data() + j * nl;
      units[u].logits.resize(nl);
      mixture_logits(rows.data(), g, nl, hmax.data() + u * g, htotal.data() + u * g, units[u].logits.data());
    });
  }

  // Stage 2: proposal weights with the global maximum, and their global total.
  const bool sampling = samples_residual(method);
  std::vector<uint64_t> proposal(U, 0);
  if (sampling) {
    std::vector<float> mx(U, -INFINITY);
    for (size_t u = 0; u < U; ++u) {
      if (!units[u].all) mx[u] = simd::kernels().max_value(units[u].logits.data(), nl);
    }
    SSA_RETURN_IF_ERROR(comm.all_reduce_max(mx.data(), U));
    pool.parallel_for(U, [&](size_t u) {
      Unit& un = units[u];
      if (un.all) return;
      un.e.resize(nl);
      proposal_weights(un.logits.data(), nl, mx[u], un.e.data());
      proposal[u] = fixed_sum(un.e.data(), nl);
    });
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(proposal.data(), U));
  }

  // Stage 3: the heavy set. The fixed rule: the global top |H|. The adaptive
  // rule: the global top k', gathered on every rank, sorted, water-filled.
  const bool adaptive = method == SSA_METHOD_SSA_ADAPTIVE;
  std::vector<TopkUnit> tk(U);
  std::vector<uint64_t> heavy_global(U, 0);
  for (size_t u = 0; u < U; ++u) {
    if (units[u].all) continue;  // k = 0: nothing
    tk[u] = TopkUnit{units[u].logits.data(), nl,
                     adaptive ? units[u].kprime : fixed_heavy_count(method, units[u].kprime, p.heavy_fraction), nc};
    heavy_global[u] = std::min<uint64_t>(tk[u].k, nc);
  }
  std::vector<std::vector<uint32_t>> heavy;  // local candidate indices
  SSA_RETURN_IF_ERROR(sharded_topk(comm, pool, tk, &heavy));
  if (adaptive) {
    struct Member {
      float proxy, e;
      uint32_t token;
    };
    std::vector<uint64_t> counts(U), all_counts(size_t{R} * U);
    for (size_t u = 0; u < U; ++u) counts[u] = heavy[u].size();
    SSA_RETURN_IF_ERROR(comm.all_gather(counts.data(), U * sizeof(uint64_t), all_counts.data()));
    uint64_t most = 0;
    for (uint64_t c : all_counts) most = std::max(most, c);
    std::vector<Member> mine(U * most, Member{0.0f, 0.0f, 0}), all(size_t{R} * U * most);
    for (size_t u = 0; u < U; ++u) {
      for (size_t i = 0; i < heavy[u].size(); ++i) {
        const uint32_t j = heavy[u][i];
        mine[u * most + i] = Member{units[u].logits[j], units[u].e[j], static_cast<uint32_t>(ca + j)};
      }
    }
    SSA_RETURN_IF_ERROR(comm.all_gather(mine.data(), mine.size() * sizeof(Member), all.data()));
    pool.parallel_for(U, [&](size_t u) {
      if (units[u].all) return;
      std::vector<Member> top;
      for (uint32_t r = 0; r < R; ++r) {
        const Member* m = all.data() + (size_t{r} * U + u) * most;
        top.insert(top.end(), m, m + all_counts[size_t{r} * U + u]);
      }
      std::sort(top.begin(), top.end(), [](const Member& a, const Member& b) {
        return a.proxy != b.proxy ? a.proxy > b.proxy : a.token < b.token;
      });
      const double total = fixed_to_double(proposal[u]);
      std::vector<double> qs(top.size());
      for (size_t i = 0; i < top.size(); ++i) qs[i] = static_cast<double>(top[i].e) / total;
      const size_t count = adaptive_heavy_count(qs.data(), qs.size(), units[u].kprime);
      heavy_global[u] = count;
      heavy[u].clear();
      for (size_t i = 0; i < count; ++i) {
        if (top[i].token >= ca && top[i].token < cb) heavy[u].push_back(static_cast<uint32_t>(top[i].token - ca));
      }
    });
  }
  for (size_t u = 0; u < U; ++u) {
    Selection& sel = (*sels)[grouped ? u * g : u];
    sel.clear();
    if (units[u].all) {
      for (size_t j = 0; j < nl; ++j) {
        sel.tokens.push_back(static_cast<uint32_t>(v0 + j));
        sel.log_pi.push_back(0.0f);
      }
      heavy_global[u] = nc;
      continue;
    }
    for (uint32_t j : heavy[u]) {
      sel.tokens.push_back(static_cast<uint32_t>(v0 + j));
      sel.log_pi.push_back(0.0f);
    }
  }
  // The stats are shared by the in-process ranks: one writes them (each rank of
  // a process group has its own).
  const bool reports = rank == 0 || sh.every_rank_reports;
  if (reports) {
    for (size_t u = 0; u < U; ++u) sh.heavy[u] = heavy_global[u];
  }
  if (!sampling) return absl::OkStatus();

  // Stage 4: residual weights and this rank's hierarchy; every rank's residual
  // mass lays the ranks end to end, in token order, under one total.
  std::vector<uint64_t> mass(2 * U, 0), all_mass(size_t{R} * 2 * U);
  pool.parallel_for(U, [&](size_t u) {
    Unit& un = units[u];
    if (un.all) return;
    uint64_t heavy_total = 0;
    for (uint32_t j : heavy[u]) heavy_total += fixed_weight(un.e[j]);
    residual_weights(method, un.e.data(), nl);
    for (uint32_t j : heavy[u]) un.e[j] = 0.0f;
    un.hierarchy.build(un.e.data(), ca, nl);
    mass[2 * u] = un.hierarchy.total();
    mass[2 * u + 1] = heavy_total;
  });
  SSA_RETURN_IF_ERROR(comm.all_gather(mass.data(), mass.size() * sizeof(uint64_t), all_mass.data()));
  std::vector<uint64_t> unique(U, 0);
  pool.parallel_for(U, [&](size_t u) {
    Unit& un = units[u];
    if (un.all) return;
    uint64_t offset = 0, grand = 0, heavy_total = 0;
    for (uint32_t r = 0; r < R; ++r) {
      const uint64_t w = all_mass[(size_t{r} * U + u) * 2];
      if (r < rank) offset += w;
      grand += w;
      heavy_total += all_mass[(size_t{r} * U + u) * 2 + 1];
    }
    const uint64_t m = un.kprime - heavy_global[u];
    if (reports) {
      sh.residual[u] = residual_mass_of(proposal[u], heavy_total);
      sh.draws[u] = m;
    }
    thread_local std::vector<uint32_t> drawn;
    drawn.clear();
    draw_range(un.hierarchy, offset, grand, m, un.rng, &drawn);
    std::sort(drawn.begin(), drawn.end());
    drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
    Selection& sel = (*sels)[grouped ? u * g : u];
    const size_t before = sel.unique;
    add_samples(drawn, un.e.data(), ca, grand, m, p.pi_min, static_cast<uint32_t>(range.begin), &sel);
    unique[u] = sel.unique - before;
  });
  SSA_RETURN_IF_ERROR(comm.all_reduce_sum(unique.data(), U));
  if (reports) {
    for (size_t u = 0; u < U; ++u) sh.unique[u] = unique[u];
  }
  return absl::OkStatus();
}

// Gathers every rank's split partials and, on rank 0, merges them in split order.
absl::Status merge_partials(Shared& sh, Collective& comm, const std::vector<AttnPartial>& parts) {
  const KvLayout& layout = sh.s.layout;
  const uint32_t d = layout.head_dim, g = layout.group_size(), nkv = layout.n_kv_heads, R = comm.size();
  uint64_t most = 0;
  for (const ShardRange& r : sh.ranges) most = std::max(most, splits_for(r.size()));
  const size_t rec = size_t{d} + 2;  // m, l, acc
  const uint64_t mine = splits_for(sh.ranges[comm.rank()].size());
  std::vector<float> send(size_t{nkv} * most * g * rec, 0.0f), recv(send.size() * R);
  for (uint32_t kv = 0; kv < nkv; ++kv) {
    for (uint64_t sp = 0; sp < mine; ++sp) {
      for (uint32_t j = 0; j < g; ++j) {
        const AttnPartial& a = parts[(kv * mine + sp) * g + j];
        float* o = send.data() + ((size_t{kv} * most + sp) * g + j) * rec;
        o[0] = a.m;
        o[1] = a.l;
        std::copy(a.acc.begin(), a.acc.end(), o + 2);
      }
    }
  }
  SSA_RETURN_IF_ERROR(comm.all_gather(send.data(), send.size() * sizeof(float), recv.data()));
  if (comm.rank() != 0 && !sh.every_rank_reports) return absl::OkStatus();
  const uint64_t n_splits = splits_for(sh.plan.n);
  std::vector<AttnPartial> all(size_t{nkv} * n_splits * g);
  for (AttnPartial& a : all) a.reset(d);
  for (uint32_t r = 0; r < R; ++r) {
    const uint64_t first = sh.ranges[r].begin / kSplitTokens, count = splits_for(sh.ranges[r].size());
    for (uint32_t kv = 0; kv < nkv; ++kv) {
      for (uint64_t sp = 0; sp < count; ++sp) {
        for (uint32_t j = 0; j < g; ++j) {
          const float* i = recv.data() + size_t{r} * send.size() + ((size_t{kv} * most + sp) * g + j) * rec;
          AttnPartial& a = all[(kv * n_splits + first + sp) * g + j];
          a.m = i[0];
          a.l = i[1];
          std::copy(i + 2, i + 2 + d, a.acc.begin());
        }
      }
    }
  }
  merge_split_partials(layout, all, n_splits, &sh.heads);
  return absl::OkStatus();
}

absl::Status rank_decode(Shared& sh, Collective& comm) {
  const KvLayout& layout = sh.s.layout;
  ThreadPool& pool = *sh.s.rt->pool;
  const ShardRange range = sh.ranges[comm.rank()];
  const LayerStore view = shard_view(layout, sh.layer, range);
  // Each rank's part takes a set of the runtime's kept buffers, as an unsharded
  // decode does (lib/decode/decode_buffers.h).
  const DecodeBufferPool::Lease buf = sh.s.rt->decode_buffers->acquire();
  if (sh.plan.dense) {
    dense_split_partials(layout, view, sh.q.data(), pool, &buf->parts);
  } else {
    std::vector<Selection>& sels = buf->sels;
    sels.resize(layout.n_q_heads);
    for (Selection& sel : sels) sel.clear();  // a kept set's capacity, not its contents
    if (sh.plan.selects()) SSA_RETURN_IF_ERROR(select_units(sh, comm, view, &sels));
    if (sh.rank_sels != nullptr) (*sh.rank_sels)[comm.rank()] = sels;
    sparse_split_partials(layout, view, range.begin, sh.plan, sh.q.data(), sels,
                          sh.p.group_selection != SSA_GROUP_OFF, pool, &buf->split, &buf->parts);
  }
  return merge_partials(sh, comm, buf->parts);
}

void add_stats(const Shared& sh, ssa_decode_stats* stats) {
  const KvLayout& layout = sh.s.layout;
  const DecodePlan& plan = sh.plan;
  const uint32_t nq = layout.n_q_heads, g = layout.group_size();
  stats->context_tokens += plan.n;
  if (plan.dense) {
    stats->tokens_read += plan.n * nq;
    return;
  }
  if (plan.window_only()) stats->window_only_heads += nq;
  if (!plan.selects()) {
    stats->tokens_read += plan.fixed_tokens() * nq;
    return;
  }
  const bool grouped = sh.p.group_selection != SSA_GROUP_OFF;
  const uint64_t nc = plan.candidates();
  for (size_t u = 0; u < sh.heavy.size(); ++u) {
    const uint32_t heads = grouped ? g : 1;
    const bool all = grouped && plan.kprime * g >= nc;
    const uint64_t scored = all ? 0 : (grouped && sh.p.group_selection == SSA_GROUP_MIXTURE ? nc * g : nc);
    stats->tokens_read += (plan.fixed_tokens() + sh.heavy[u] + sh.unique[u]) * heads;
    stats->heavy_tokens += sh.heavy[u] * heads;
    stats->draws += sh.draws[u] * heads;
    stats->unique_samples += sh.unique[u] * heads;
    for (uint32_t j = 0; j < heads; ++j) stats->residual_proxy_mass += sh.residual[u];  // per head, as unsharded
    stats->scored_tokens += scored;  // counted once per group, as unsharded
  }
}

// The rows each query head read, as the unsharded decode lists them: sink and
// local rows, then the selected rows of every rank, in layer indices (a group's
// rows for every head of the group). Unsorted, as the unsharded traces are.
void sharded_traces(const Shared& sh, std::vector<HeadTrace>* traces) {
  const KvLayout& layout = sh.s.layout;
  const DecodePlan& plan = sh.plan;
  const uint32_t nq = layout.n_q_heads, g = layout.group_size();
  const bool grouped = sh.p.group_selection != SSA_GROUP_OFF;
  traces->assign(nq, HeadTrace{});
  for (uint32_t h = 0; h < nq; ++h) {
    HeadTrace& t = (*traces)[h];
    auto add_range = [&](uint64_t t0, uint64_t t1) {
      for (uint64_t i = t0; i < t1; ++i) {
        t.tokens.push_back(static_cast<uint32_t>(i));
        t.log_pi.push_back(0.0f);
      }
    };
    if (plan.dense) {
      add_range(0, plan.n);
      continue;
    }
    add_range(0, plan.sink_end);
    add_range(plan.local_begin, plan.n);
    if (sh.rank_sels == nullptr) continue;
    const uint32_t unit_head = grouped ? h / g * g : h;
    for (size_t r = 0; r < sh.rank_sels->size(); ++r) {
      const std::vector<Selection>& sels = (*sh.rank_sels)[r];
      if (sels.size() <= unit_head) continue;
      const Selection& sel = sels[unit_head];
      for (size_t i = 0; i < sel.tokens.size(); ++i) {
        t.tokens.push_back(static_cast<uint32_t>(sel.tokens[i] + sh.ranges[r].begin));
        t.log_pi.push_back(sel.log_pi[i]);
      }
    }
  }
}

}  // namespace

absl::Status check_group_decode(const ssa_session& s, const LayerStore& layer, uint32_t layer_index, const void* q,
                                const ssa_decode_params& p, uint64_t seed) {
  ProcessGroup& g = *s.rt->group;
  // q may be device memory (a CUDA rank): hashed from a host copy.
  std::vector<uint8_t> host(size_t{s.layout.n_q_heads} * s.layout.row_bytes());
  const absl::Status read = s.backend->read_caller_buffer(s, q, host.size(), p.stream, host.data());
  std::lock_guard<std::mutex> lock(g.call_mutex());
  const absl::Status st = check_same_call(g, layer, layer_index, read.ok() ? q_summary(s.layout, host.data()) : 0,
                                          p, seed, read);
  return st;
}

absl::Status sharded_decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                                  const void* q_in, void* out, const ssa_decode_params& p, uint64_t seed,
                                  ssa_decode_stats* stats, std::vector<HeadTrace>* traces) {
  if (p.target_error > 0.0f) return unsupported(kShardedTargetUnsupported);
  const KvLayout& layout = s.layout;
  const uint32_t d = layout.head_dim, nq = layout.n_q_heads;
  Shared sh{s, layer, layer_index, p, seed, plan_decode(layer.n_tokens, p), {}, {}, {}, false, {}, {}, {}, {}, nullptr};
  sh.q.resize(size_t{nq} * d);
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  for (size_t i = 0; i < sh.q.size(); ++i) sh.q[i] = load_as_f32(q_in, layout.dtype, i) * scale;
  ProcessGroup* const process_group = s.rt->group.get();
  const auto n_shards = process_group != nullptr ? process_group->size() : static_cast<uint32_t>(s.rt->devices.size());
  sh.ranges = shard_ranges(layer.n_tokens, n_shards, s.rt->shard_tokens);
  const size_t U = p.group_selection != SSA_GROUP_OFF ? layout.n_kv_heads : nq;
  sh.heavy.assign(U, 0);
  sh.unique.assign(U, 0);
  sh.draws.assign(U, 0);
  sh.residual.assign(U, 0.0);

  std::vector<std::vector<Selection>> rank_sels;
  if (traces != nullptr) {
    // A process group's rank sees its own shard's selection alone.
    if (process_group != nullptr) {
      return unsupported(kGroupTracesUnsupported);
    }
    rank_sels.resize(n_shards);
    sh.rank_sels = &rank_sels;
  }
  if (process_group != nullptr) {
    // This process is one rank: the others run the same call in theirs.
    std::lock_guard<std::mutex> lock(process_group->call_mutex());
    sh.every_rank_reports = true;
    SSA_RETURN_IF_ERROR(check_same_call(*process_group, layer, layer_index, q_summary(layout, q_in), p, seed));
    absl::Status st;
    try {
      st = rank_decode(sh, *process_group);
    } catch (...) {
      process_group->mark_out_of_step();
      throw;
    }
    if (!st.ok()) process_group->mark_out_of_step();
    SSA_RETURN_IF_ERROR(st);
  } else {
    InProcessGroup group(n_shards);
    SSA_RETURN_IF_ERROR(group.run([&](Collective& comm) { return rank_decode(sh, comm); }));
    if (traces != nullptr) sharded_traces(sh, traces);
  }

  std::vector<float> o(d);
  for (uint32_t h = 0; h < nq; ++h) {
    sh.heads[h].finish(o.data());
    for (uint32_t i = 0; i < d; ++i) store_from_f32(out, layout.dtype, size_t{h} * d + i, o[i]);
  }
  if (stats != nullptr) add_stats(sh, stats);
  return absl::OkStatus();
}

}  // namespace ssa
