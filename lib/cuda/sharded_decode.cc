// The decode of sharded CUDA sessions (docs/SHARDING.md): a batch of items (one
// item for ssa_decode), one rank per shard holding any item's tokens, each a
// thread on its shard's device running the kernels of an unsharded decode over
// the items it holds (one launch set), with the selection made globally:
//   proxy scores of the rank's candidates -> (sampling) every row's maximum
//   all-gathered -> the global top-k over every rank's scores
//   (device_sharded_topk.h: all-reduced radix histograms, ties to the lowest
//   tokens) as the rank's heavy bitmap -> (sampling) the residual's block and
//   chunk sums, every rank's residual total all-gathered so that the ranks lie
//   end to end in one global mass, the draws of the one Philox stream each kept
//   by the rank its first-level target falls in -> the read sets and the
//   samples' log pi with the global total -> the split partials, copied to the
//   first device in token order -> one merge per item there.
// The collectives run over every row of the batch (item x selection head), a
// rank contributing nothing for the items it does not hold, so every rank makes
// the same calls whatever it holds; device buffers (the top-k's histograms) are
// reduced on the devices (peer_collective.h), the rest through the host. The
// heavy set and the samples are exactly the unsharded decode's: the sampler's
// hierarchy is cut at candidate offsets (1024-candidate chunks from sink_end),
// so a selecting item's range on a rank starts at the first chunk boundary at
// or after the shard's start: every
// chunk, block and bitmap word lies in one rank, and a rank reads the up to 1023
// tokens it takes past its shard's end from the next shard's pages (peer
// access). The output differs from the unsharded one only by where the
// attention's splits fall (floating-point rounding). The adaptive heavy rule
// first finds the global top k' the same way, water-fills their gathered scores
// on every rank for |H| (kernels/sharded_adaptive.h), then takes the global top
// |H|. The mixture proposal's q-head maxima and normalisers are global too
// (mixture_logits). Not sharded here: error-targeted decodes
// (SSA_ERR_UNSUPPORTED).
#include <cuda_runtime.h>
#include <stddef.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "common/sampling_hierarchy.h"
#include "cuda_backend.h"
#include "device_error.h"
#include "device_guard.h"
#include "device_sharded_topk.h"
#include "device_state.h"
#include "device_tiers.h"
#include "group_collective.h"
#include "kernels/cuda_decode.h"
#include "launch_set.h"
#include "method_plan.h"
#include "peer_collective.h"
#include "shard/group_call_check.h"
#include "shard/group_margin.h"
#include "shard/in_process_collective.h"
#include "shard/shard_map.h"
#include "shard/sharded_decode.h"
#include "sharded_work.h"

namespace ssa::cuda {
namespace {

using namespace sharded;

// Events of one decode, destroyed on every path out.
struct Events {
  std::vector<cudaEvent_t> e;
  explicit Events(size_t n) : e(n, nullptr) {}
  ~Events() {
    for (cudaEvent_t x : e)
      if (x != nullptr) cudaEventDestroy(x);
  }
  cudaError_t create() {
    for (cudaEvent_t& x : e) {
      const cudaError_t r = cudaEventCreateWithFlags(&x, cudaEventDisableTiming);
      if (r != cudaSuccess) return r;
    }
    return cudaSuccess;
  }
};

// A rank's item: the unsharded item's budget, its token ranges clipped to the
// rank's tokens, in the coordinates of its view (token 0 = view_begin, the start
// of the page holding range.begin). A rank holding no candidate reads all its
// tokens (every one a sink or local token).
DecodeItem rank_item(const DecodeItem& global, ShardRange range, uint64_t view_begin) {
  auto local = [&](uint64_t t) {
    return static_cast<uint32_t>(std::clamp<uint64_t>(t, range.begin, range.end) - view_begin);
  };
  DecodeItem it{};
  it.n_tokens = static_cast<uint32_t>(range.end - view_begin);
  it.first_token = static_cast<uint32_t>(range.begin - view_begin);
  it.sink_end = local(global.sink_end);
  it.local_begin = local(global.local_begin);
  it.n_select = global.n_select;
  it.n_heavy = global.n_heavy;
  return it;
}

// An item's range on each shard: the shard's own tokens, or for a selecting
// item the chunk-aligned ranges of the sampler's hierarchy (shard_map.h).
absl::Status item_ranges(const ssa_session& s, uint32_t n_shards, uint64_t n_tokens, bool align, uint64_t sink_end,
                         std::vector<ShardRange>* out) {
  const std::vector<ShardRange> own = shard_ranges(n_tokens, n_shards, s.rt->shard_tokens);
  if (!align) {
    *out = own;
    return absl::OkStatus();
  }
  *out = chunk_aligned_ranges(n_tokens, n_shards, s.rt->shard_tokens, sink_end, kChunkTokens);
  for (size_t i = 0; i < out->size(); ++i) {
    if ((*out)[i].size() > 0 && (*out)[i].begin >= own[i].end)
      return internal_error("sharded decode: a range starts past its shard");
  }
  return absl::OkStatus();
}

// A group's partials (every rank's, of every item, with the exchange's
// padding to send_splits) all-gathered, then each item's laid out end to end
// over the ranks holding it, in rank order (token order), in its gather buffer
// on this rank's device: the in-process layout, which every rank then merges.
absl::Status exchange_partials(Shared& sh, Collective& comm, const RankWork& rw, const Workspace& ws,
                               cudaStream_t stream) {
  const KvLayout& L = sh.L;
  const size_t rec = size_t{L.head_dim} + 2, nq = L.n_q_heads;
  const size_t item_floats = nq * sh.send_splits * rec, block = item_floats * sh.items.size();
  const size_t width = size_t{rw.plan.n_splits} * rec;
  for (uint32_t li = 0; li < rw.items.size(); ++li) {
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(sh.send + size_t{rw.items[li]} * item_floats, sh.send_splits * rec * sizeof(float),
                                      ws.partial + size_t{li} * nq * width, width * sizeof(float),
                                      width * sizeof(float), nq, cudaMemcpyDeviceToDevice, stream),
                    "partial output copy");
  }
  SSA_RETURN_IF_ERROR(comm.all_gather(sh.send, block * sizeof(float), sh.recv));
  for (ItemWork& w : sh.items) {
    const size_t j = static_cast<size_t>(&w - sh.items.data());
    for (uint32_t r = 0; r < comm.size(); ++r) {
      if (w.range[r].size() == 0) continue;
      const size_t cols = size_t{sh.rank_splits[r]} * rec;
      SSA_CUDA_RETURN(cudaMemcpy2DAsync(w.gather + w.split_offset[r] * rec, w.splits * rec * sizeof(float),
                                        sh.recv + r * block + j * item_floats, sh.send_splits * rec * sizeof(float),
                                        cols * sizeof(float), nq, cudaMemcpyDeviceToDevice, stream),
                      "partial output layout");
    }
  }
  return absl::OkStatus();
}

absl::Status rank_decode(Shared& sh, Collective& host_comm) {
  const KvLayout& L = sh.L;
  const uint32_t rank = host_comm.rank();
  RankWork& rw = sh.ranks[rank];
  // A group's rank may hold none of the items: it still makes every exchange.
  const ssa_session& s0 = *sh.items[rw.items.empty() ? 0 : rw.items[0]].job->s;
  SessionState& st = rank_state(sh, s0, rw.shard);
  const DeviceGuard on(st.device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  DecodeBatch& b = rw.b;
  const uint32_t n_held = static_cast<uint32_t>(rw.items.size());
  std::vector<std::shared_ptr<SessionState::LayerCache>> tables(n_held);
  for (uint32_t li = 0; li < n_held; ++li) {
    const ItemWork& w = sh.items[rw.items[li]];
    const ShardRange range = w.range[rw.shard];
    // The rank's pages (those of its view, shard_view's), read to range.end.
    const uint64_t first = shard_begin(rw.shard, w.job->s->rt->shard_tokens, range.end);
    absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> t =
        layer_tables(*w.job->s, rank_state(sh, *w.job->s, rw.shard), sh.layer_index, *w.job->layer,
                     rw.view_begin[li] / L.page_tokens, L.pages_for(range.end), range.end - first,
                     &b.items[li]);
    if (!t.ok()) return t.status();
    tables[li] = *std::move(t);
    b.items[li].q = w.q;
    b.items[li].out = nullptr;  // the merge on the first device writes the output
  }
  const WorkspacePlan& plan = rw.plan;
  const cudaStream_t stream = st.stream;
  // Device buffers stay on the devices (in one process), or go to the group's
  // transport in place or through the host (a group of processes).
  PeerCollective peer(host_comm, stream);
  std::optional<GroupDeviceCollective> grouped;
  if (sh.group != nullptr) grouped.emplace(*sh.group, stream);
  Collective& comm = grouped ? static_cast<Collective&>(*grouped) : peer;
  const bool any = n_held > 0;  // kernels run only over items the rank holds
  DeviceMem blob;
  if (any) SSA_CUDA_RETURN(blob.alloc(plan.total_bytes, stream), "cudaMallocAsync of the decode workspace");
  const Workspace ws = any ? bind_workspace(blob.p, plan) : Workspace{};
  SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, sh.q_ready, 0), "decode ordering");
  const RowMap m{rw, sh.sel_heads};
  const uint32_t batch_rows = static_cast<uint32_t>(sh.items.size()) * sh.sel_heads;
  // Rows are read back whole for the stats; the kernels set only what they use.
  if (sh.selects && any)
    SSA_CUDA_RETURN(cudaMemsetAsync(ws.rows, 0, plan.rows * sizeof(RowState), stream), "decode setup");
  // Also without a selection: the row states (a window-only item's read sets) are set here.
  if (any) SSA_CUDA_RETURN(run_shard_scores(b, plan, ws, stream), "proxy score kernels");
  if (sh.selects) {
    if (sh.mixture) SSA_RETURN_IF_ERROR(mixture_logits(comm, sh, m, b, plan, ws, stream));
    std::vector<uint32_t> batch_max;
    if (sh.sampling) SSA_RETURN_IF_ERROR(share_row_max(comm, m, batch_rows, ws.rows, stream, &batch_max));
    std::vector<uint64_t> heavy_k = row_budgets(sh, &DecodeItem::n_heavy);
    if (sh.adaptive) {
      SSA_RETURN_IF_ERROR(adaptive_heavy_counts(comm, sh, m, b, plan, ws, batch_max, stream, &heavy_k));
      if (rank == 0 || sh.group != nullptr) sh.adaptive_heavy = heavy_k;
    }
    SSA_RETURN_IF_ERROR(select_heavy(comm, sh, m, b, ws, heavy_k, stream));
    if (sh.adaptive) SSA_RETURN_IF_ERROR(set_row_budgets(m, b, heavy_k, sh.sampling, ws.rows, stream));
    if (sh.sampling) SSA_RETURN_IF_ERROR(draw_samples(comm, m, batch_rows, b, plan, ws, stream));
    if (any) SSA_CUDA_RETURN(run_shard_read_sets(b, plan, ws, stream), "read set kernels");
  }
  if (any) SSA_CUDA_RETURN(run_split_partials(b, plan, ws, stream), "attention kernels");
  // Each item's partials end to end over its ranks, in shard order (so in token
  // order), on the first device: ws.partial is [item][q head][split][record].
  const size_t rec = size_t{L.head_dim} + 2, width = size_t{plan.n_splits} * rec;
  if (sh.group != nullptr) {
    SSA_RETURN_IF_ERROR(exchange_partials(sh, comm, rw, ws, stream));
  } else {
    for (uint32_t li = 0; li < n_held; ++li) {
      const ItemWork& w = sh.items[rw.items[li]];
      SSA_CUDA_RETURN(cudaMemcpy2DAsync(w.gather + w.split_offset[rw.shard] * rec, w.splits * rec * sizeof(float),
                                        ws.partial + size_t{li} * L.n_q_heads * width, width * sizeof(float),
                                        width * sizeof(float), L.n_q_heads, cudaMemcpyDefault, stream),
                      "partial output copy");
    }
  }
  std::vector<RowState> rs;
  if (sh.want_stats && sh.selects && any) {
    rs.resize(m.local_rows());
    SSA_CUDA_RETURN(cudaMemcpyAsync(rs.data(), ws.rows, rs.size() * sizeof(RowState), cudaMemcpyDeviceToHost,
                                    stream),
                    "row state read-back");
  }
  SSA_CUDA_RETURN(cudaEventRecord(sh.done[rank], stream), "decode ordering");
  for (uint32_t li = 0; li < n_held; ++li) {
    SessionState& item_state = rank_state(sh, *sh.items[rw.items[li]].job->s, rw.shard);
    absl::MutexLock lock(&item_state.mu);
    if (tables[li]->last_use.record(stream) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
    }
  }
  if (!rs.empty()) SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  if (sh.want_stats && sh.selects) SSA_RETURN_IF_ERROR(gather_stats(comm, sh, m, rs));
  return absl::OkStatus();
}

void add_stats(const Shared& sh, ssa_decode_stats* stats) {
  const uint32_t nq = sh.L.n_q_heads, g = sh.L.group_size();
  const bool grouped = sh.p.group_selection != SSA_GROUP_OFF;
  for (size_t j = 0; j < sh.items.size(); ++j) {
    const ItemWork& w = sh.items[j];
    const DecodePlan& pl = w.job->plan;
    stats->context_tokens += pl.n;
    if (pl.window_only()) stats->window_only_heads += nq;
    const uint64_t always = pl.dense ? pl.n : pl.fixed_tokens();
    for (uint32_t h = 0; h < nq; ++h) {
      if (sh.all_dense || w.dense) {
        stats->tokens_read += pl.n;
        if (!pl.dense) stats->heavy_tokens += pl.candidates();  // a group budget over every candidate
        continue;
      }
      const size_t row = j * sh.sel_heads + (grouped ? h / g : h);
      const uint64_t heavy = sh.selects ? sh.heavy[row] : 0;
      const uint64_t unique = sh.selects && sh.sampling ? sh.unique[row] : 0;
      stats->tokens_read += always + heavy + unique;
      stats->heavy_tokens += heavy;
      // Once per selection row: G scores a candidate for the mixture (its q heads').
      if ((!grouped || h % g == 0) && pl.kprime > 0) stats->scored_tokens += pl.candidates() * (sh.mixture ? g : 1);
      if (w.selects && sh.sampling) {
        // Every row's m: its selection less its heavy count (row_init.cuh, or the
        // adaptive rule's).
        stats->draws += w.global.n_select - (sh.adaptive ? sh.adaptive_heavy[row] : w.global.n_heavy);
        stats->unique_samples += unique;
        const double total = sh.resid_mass[row] + sh.heavy_mass[row];
        stats->residual_proxy_mass += total > 0 ? sh.resid_mass[row] / total : 0.0;
      }
    }
  }
}

// What a decode of these jobs refuses before any exchange (the same on every
// rank of a group: it depends on the call's arguments and the layers' lengths
// alone). A group's rank must also keep every token its range reads: the
// margin after its shard (group_margin.h) covers the chunk alignment unless the
// sink tokens reach past a whole shard.
absl::Status refusal(const std::vector<LaunchJob>& jobs, const ssa_decode_params& p) {
  const ssa_session& s0 = *jobs[0].s;
  const uint32_t g = s0.layout.group_size();
  for (const LaunchJob& job : jobs) {
    if (job.plan.targeted) return unsupported(kShardedTargetUnsupported);
    if (layer_has_host_pages(*job.layer)) return unsupported(kShardedMappedUnsupported);
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(static_cast<cudaStream_t>(p.stream), &cap), "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) return unsupported(kShardedCaptureUnsupported);
  const ProcessGroup* group = s0.rt->group.get();
  if (group == nullptr) return absl::OkStatus();
  for (const LaunchJob& job : jobs) {
    DecodeItem global{};
    plan_item(job.plan, p, g, &global);
    const bool selects = !(job.plan.dense || group_reads_all(job.plan, p, g)) && global.n_select > 0;
    std::vector<ShardRange> ranges;
    SSA_RETURN_IF_ERROR(
        item_ranges(*job.s, group->size(), job.layer->n_tokens, selects, global.sink_end, &ranges));
    for (uint32_t r = 0; r < group->size(); ++r) {
      const HeldRange kept = held_with_margin(r, group->size(), s0.rt->shard_tokens);
      const uint64_t view_begin = ranges[r].begin / s0.layout.page_tokens * s0.layout.page_tokens;
      if (ranges[r].size() > 0 && (view_begin < kept.begin || ranges[r].end > kept.end)) {
        return unsupported("a decode of a CUDA group's session whose sink tokens (", global.sink_end,
                           ") reach past the first shard's end: rank ", r, " would read tokens another rank "
                           "keeps; use fewer sink tokens or a larger shard_tokens");
      }
    }
  }
  return absl::OkStatus();
}

// One sharded decode of up to kMaxBatchItems jobs of one runtime, layout and
// pointer space, refused by nothing above. On a group's rank, *exchanged is set
// once its first collective is made (a failure after it leaves the group out of step).
absl::Status decode_jobs(const std::vector<LaunchJob>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                         uint64_t seed, ssa_decode_stats* stats, bool* exchanged) {
  const ssa_session& s0 = *jobs[0].s;
  const KvLayout& L = s0.layout;
  const uint32_t g = L.group_size();
  Shared sh(s0, layer_index, p, seed);
  sh.group = s0.rt->group.get();
  sh.items.resize(jobs.size());
  sh.all_dense = true;
  for (size_t j = 0; j < jobs.size(); ++j) {
    ItemWork& w = sh.items[j];
    w.job = &jobs[j];
    w.dense = w.job->plan.dense || group_reads_all(w.job->plan, p, g);
    plan_item(w.job->plan, p, g, &w.global);
    sh.all_dense = sh.all_dense && w.dense;
  }
  // Every rank's launch set starts as this one.
  DecodeBatch m{};
  m.shape = decode_shape(L);
  set_method(sh.all_dense ? SSA_METHOD_DENSE : p.method, &m);
  if (!sh.all_dense) set_group(p, g, &m);
  m.pi_min = p.pi_min;
  m.layer = layer_index;
  m.seed = seed;
  m.step = p.step;
  sh.sel_heads = m.sel_heads();
  for (ItemWork& w : sh.items) {
    w.selects = !sh.all_dense && !w.dense && w.global.n_select > 0;
    sh.selects = sh.selects || w.selects;
  }
  if (sh.selects) {
    sh.adaptive = m.heavy == HeavyRule::kAdaptive;
    sh.mixture = m.group == GroupProposal::kMixture;
    sh.sampling = m.sampling != Sampling::kNone;
    for (const ItemWork& w : sh.items) {
      if (sh.sampling && w.selects && w.job->plan.candidates() > kMaxSampledCandidates)
        return absl::UnimplementedError("CUDA backend: sampling over 2^26 or more candidate tokens in one session");
    }
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  // The ranks: every shard holding some item's tokens, in shard order; a
  // group's every rank (this process runs one of them).
  const uint32_t S = sh.group != nullptr ? sh.group->size() : shard_count(s0);
  std::vector<bool> used(S, sh.group != nullptr);
  for (ItemWork& w : sh.items) {
    SSA_RETURN_IF_ERROR(
        item_ranges(*w.job->s, S, w.job->layer->n_tokens, w.selects, w.global.sink_end, &w.range));
    for (uint32_t i = 0; i < S; ++i) used[i] = used[i] || w.range[i].size() > 0;
  }
  for (uint32_t i = 0; i < S; ++i) {
    if (!used[i]) continue;
    RankWork rw;
    rw.shard = i;
    sh.ranks.push_back(std::move(rw));
  }
  const auto R = static_cast<uint32_t>(sh.ranks.size());
  const uint32_t me = sh.group != nullptr ? sh.group->rank() : 0;
  const uint32_t split_cap = kMaxSplits / R;
  // Each rank's launch set, planned here (a group's rank plans its own): the
  // split counts lay out the gather buffers.
  for (RankWork& rw : sh.ranks) {
    DecodeBatch& b = rw.b;
    b = m;
    for (uint32_t j = 0; j < sh.items.size(); ++j) {
      const ShardRange range = sh.items[j].range[rw.shard];
      if (range.size() == 0) continue;
      const uint64_t view_begin = range.begin / L.page_tokens * L.page_tokens;
      b.items[rw.items.size()] = rank_item(sh.items[j].global, range, view_begin);
      rw.items.push_back(j);
      rw.view_begin.push_back(view_begin);
    }
    b.n_items = static_cast<uint32_t>(rw.items.size());
    if (sh.group != nullptr && rw.shard != me) continue;
    if (b.n_items == 0) continue;  // a group's rank holding nothing: no launch set, no splits
    int sms = 0;
    SSA_CUDA_RETURN(
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rank_state(sh, s0, rw.shard).device),
        "cudaDeviceGetAttribute");
    SSA_CUDA_RETURN(plan_workspace(&b, sms, &rw.plan), "decode planning");
    if (rw.plan.n_splits > split_cap) {
      b.n_splits = split_cap;
      SSA_CUDA_RETURN(plan_workspace(&b, sms, &rw.plan), "decode planning");
    }
  }
  // Every rank's split count: planned here, or (a group) each rank's own, all-gathered.
  sh.rank_splits.assign(S, 0);
  if (sh.group != nullptr) {
    *exchanged = true;
    const uint64_t mine = sh.ranks[me].plan.n_splits;
    std::vector<uint64_t> all(S);
    SSA_RETURN_IF_ERROR(sh.group->all_gather(&mine, sizeof mine, all.data()));
    for (uint32_t r = 0; r < S; ++r) {
      if (all[r] > kMaxSplits) return internal_error("rank ", r, " of the group planned ", all[r], " splits");
      sh.rank_splits[r] = static_cast<uint32_t>(all[r]);
      sh.send_splits = std::max(sh.send_splits, sh.rank_splits[r]);
    }
  } else {
    for (const RankWork& rw : sh.ranks) sh.rank_splits[rw.shard] = rw.plan.n_splits;
  }
  size_t gather_floats = 0;
  const size_t rec = size_t{L.head_dim} + 2;
  for (ItemWork& w : sh.items) {
    w.split_offset.assign(S, 0);
    for (const RankWork& rw : sh.ranks) {
      if (w.range[rw.shard].size() == 0) continue;
      w.split_offset[rw.shard] = w.splits;
      w.splits += sh.rank_splits[rw.shard];
    }
    gather_floats += size_t{L.n_q_heads} * w.splits * rec;
  }
  // A group's ranks gather the stats whether or not this rank's caller asked for
  // them: the exchanges must be the same on every rank.
  sh.want_stats = stats != nullptr || sh.group != nullptr;
  const size_t qbytes = size_t{L.n_q_heads} * L.row_bytes();
  const bool staged = host_buffers(s0);
  DeviceMem stage, gather, exchange;
  if (staged) SSA_CUDA_RETURN(stage.alloc(2 * qbytes * jobs.size(), stream), "cudaMallocAsync of q/out staging");
  SSA_CUDA_RETURN(gather.alloc(gather_floats * sizeof(float), stream), "cudaMallocAsync of the shards' partials");
  if (sh.group != nullptr) {
    // send: [item][q head][send_splits][record]; recv: every rank's send.
    const size_t block = sh.items.size() * L.n_q_heads * sh.send_splits * rec;
    SSA_CUDA_RETURN(exchange.alloc((1 + size_t{S}) * block * sizeof(float), stream),
                    "cudaMallocAsync of the group's partials");
    sh.send = static_cast<float*>(exchange.p);
    sh.recv = sh.send + block;
    // Splits a rank does not fill are never read; zeroed so that no rank sends uninitialised memory.
    SSA_CUDA_RETURN(cudaMemsetAsync(sh.send, 0, block * sizeof(float), stream), "decode setup");
  }
  size_t at = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    ItemWork& w = sh.items[j];
    if (staged) {
      uint8_t* base = static_cast<uint8_t*>(stage.p) + 2 * qbytes * j;
      SSA_CUDA_RETURN(cudaMemcpyAsync(base, jobs[j].q, qbytes, cudaMemcpyHostToDevice, stream), "q upload");
      w.q = base;
      w.out = base + qbytes;
    } else {
      w.q = jobs[j].q;
      w.out = jobs[j].out;
    }
    w.gather = static_cast<float*>(gather.p) + at;
    at += size_t{L.n_q_heads} * w.splits * rec;
  }
  Events events(1 + R);
  SSA_CUDA_RETURN(events.create(), "cudaEventCreate");
  sh.q_ready = events.e[0];
  sh.done.assign(events.e.begin() + 1, events.e.end());
  SSA_CUDA_RETURN(cudaEventRecord(sh.q_ready, stream), "decode ordering");
  absl::Status ranks;
  if (sh.group != nullptr) {
    ranks = rank_decode(sh, *sh.group);
  } else {
    InProcessGroup group(R);
    ranks = group.run([&](Collective& comm) { return rank_decode(sh, comm); });
  }
  if (!ranks.ok()) {
    // Work a rank queued may still write the gather buffers, freed on the caller's stream.
    for (const RankWork& rw : sh.ranks) {
      if (sh.group != nullptr && rw.shard != me) continue;
      const SessionState& st = rank_state(sh, s0, rw.shard);
      const DeviceGuard on(st.device);
      if (cudaStreamSynchronize(st.stream) != cudaSuccess) cudaGetLastError();
    }
    return ranks;
  }
  if (sh.group != nullptr) {
    SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, sh.done[me], 0), "decode ordering");
  } else {
    for (cudaEvent_t e : sh.done) SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, e, 0), "decode ordering");
  }
  // One merge per item: the items' split counts differ (the ranks holding them do).
  for (const ItemWork& w : sh.items) {
    DecodeBatch mb{};
    mb.shape = decode_shape(L);
    mb.n_items = 1;
    mb.overlap_launches = false;  // after event waits, not after a kernel
    mb.items[0].out = w.out;
    // Any length but 0: an item of no tokens is idle (item_idle) and writes nothing.
    mb.items[0].n_tokens = static_cast<uint32_t>(w.job->layer->n_tokens);
    WorkspacePlan mp{};
    mp.n_splits = w.splits;
    Workspace mw{};
    mw.partial = w.gather;
    SSA_CUDA_RETURN(run_merge_partials(mb, mp, mw, stream), "merge kernel");
  }
  if (staged) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      SSA_CUDA_RETURN(cudaMemcpyAsync(jobs[j].out, sh.items[j].out, qbytes, cudaMemcpyDeviceToHost, stream),
                      "out download");
    }
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  }
  if (stats != nullptr) add_stats(sh, stats);
  return absl::OkStatus();
}

// The hash of a job's q as a group's summary carries it: from a host copy once
// the caller's stream wrote it.
absl::StatusOr<uint64_t> job_q_summary(const LaunchJob& job, const ssa_decode_params& p) {
  const KvLayout& L = job.s->layout;
  if (host_buffers(*job.s)) return q_summary(L, job.q);
  std::vector<uint8_t> host(size_t{L.n_q_heads} * L.row_bytes());
  SSA_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(p.stream)), "decode stream");
  SSA_CUDA_RETURN(cudaMemcpy(host.data(), job.q, host.size(), cudaMemcpyDeviceToHost), "q read-back");
  return q_summary(L, host.data());
}

// A decode of a rank of a group of processes, a collective call: each job's
// summary exchanged (with this rank's refusal, so that its peers return it),
// then the decode, whose every exchange every rank makes.
absl::Status group_decode_jobs(const std::vector<LaunchJob>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                               uint64_t seed, ssa_decode_stats* stats) {
  ProcessGroup& g = *jobs[0].s->rt->group;
  std::lock_guard<std::mutex> lock(g.call_mutex());
  const absl::Status refused = refusal(jobs, p);
  for (const LaunchJob& job : jobs) {
    absl::StatusOr<uint64_t> q_hash = job_q_summary(job, p);
    absl::Status local = refused.ok() ? q_hash.status() : refused;
    SSA_RETURN_IF_ERROR(
        check_same_call(g, *job.layer, layer_index, q_hash.ok() ? *q_hash : 0, p, seed, std::move(local)));
  }
  bool exchanged = false;
  absl::Status st;
  try {
    st = decode_jobs(jobs, layer_index, p, seed, stats, &exchanged);
  } catch (...) {
    g.mark_out_of_step();
    throw;
  }
  if (!st.ok() && exchanged) g.mark_out_of_step();
  return st;
}

}  // namespace

// A rank of a group of processes decodes here too (even a group of one: its
// decodes are the group's collective calls).
bool sharded_session(const ssa_session& s) { return shard_count(s) > 1 || s.rt->group != nullptr; }

absl::Status sharded_decode(const std::vector<LaunchJob>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                            uint64_t seed, ssa_decode_stats* stats) {
  if (jobs[0].s->rt->group != nullptr) {
    // Job by job, as ssa_decode_batch on a group's rank calls them: every job a collective call.
    for (const LaunchJob& job : jobs) SSA_RETURN_IF_ERROR(group_decode_jobs({job}, layer_index, p, seed, stats));
    return absl::OkStatus();
  }
  for (const std::vector<LaunchJob>& set : launch_sets(jobs)) {
    SSA_RETURN_IF_ERROR(refusal(set, p));
    bool exchanged = false;
    SSA_RETURN_IF_ERROR(decode_jobs(set, layer_index, p, seed, stats, &exchanged));
  }
  return absl::OkStatus();
}

}  // namespace ssa::cuda
