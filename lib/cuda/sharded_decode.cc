// The decode of a sharded CUDA session (docs/SHARDING.md): one rank per shard
// that holds tokens, each on its shard's device and stream, reading only its own
// pages (its view, lib/shard/shard_map.h), through the same kernels as an
// unsharded decode with the selection made globally:
//   proxy scores of the shard's candidates -> the global top-k over every
//   shard's scores (device_sharded_topk.h: all-reduced radix histograms, ties to
//   the lowest tokens), as the shard's heavy bitmap -> its read sets -> its split
//   partials, copied to the first device in split order -> one merge there.
// So the heavy set is exactly the unsharded one, and the output differs from it
// only by the attention's split boundaries (floating-point rounding). The
// sampling methods need the proposal's global maximum and normaliser and the
// draws placed by residual mass (not built: SSA_ERR_UNSUPPORTED), as do the
// mixture proposal and error-targeted decodes.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend.h"
#include "device_error.h"
#include "device_guard.h"
#include "device_sharded_topk.h"
#include "device_state.h"
#include "device_tiers.h"
#include "kernels/cuda_decode.h"
#include "launch_set.h"
#include "method_plan.h"
#include "shard/in_process_collective.h"
#include "shard/shard_map.h"
#include "shard/sharded_decode.h"

namespace ssa::cuda {
namespace {

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

// What every rank reads; each rank writes only its own slots.
struct Shared {
  Shared(const ssa_session& s_, const LayerStore& l, uint32_t li, const ssa_decode_params& p_, uint64_t seed_,
         const DecodePlan& plan_)
      : s(s_), layer(l), layer_index(li), p(p_), seed(seed_), plan(plan_) {}
  const ssa_session& s;
  const LayerStore& layer;
  uint32_t layer_index;
  const ssa_decode_params& p;
  uint64_t seed;
  DecodePlan plan;
  DecodeItem global{};  // the unsharded item's ranges and budget
  bool all_dense = false, selects = false;
  std::vector<uint32_t> shard;      // per rank: its shard
  std::vector<ShardRange> ranges;   // per rank
  const void* q = nullptr;          // device, first device
  cudaEvent_t q_ready = nullptr;    // on the caller's stream, after q and the gather buffer
  std::vector<cudaEvent_t> done;    // per rank: its partials are in the gather buffer
  float* gather = nullptr;          // [n_q_heads][total splits][head_dim + 2], first device
  uint32_t cap = 0;                 // most splits one rank may take
  uint32_t total_splits = 0;        // set by rank 0
  bool want_stats = false;
  std::vector<uint64_t> heavy;      // per selection row, over all shards (rank 0)
};

// A shard's item: the unsharded item's budget, its token ranges clipped to the
// shard's tokens. A shard holding no candidate reads all its tokens (every one a
// sink or local token).
DecodeItem shard_item(const DecodeItem& global, ShardRange range) {
  auto local = [&](uint64_t t) {
    return static_cast<uint32_t>(std::clamp<uint64_t>(t, range.begin, range.end) - range.begin);
  };
  DecodeItem it{};
  it.n_tokens = static_cast<uint32_t>(range.size());
  it.sink_end = local(global.sink_end);
  it.local_begin = local(global.local_begin);
  it.n_select = global.n_select;
  it.n_heavy = global.n_heavy;
  return it;
}

absl::Status rank_decode(Shared& sh, Collective& comm) {
  const ssa_session& s = sh.s;
  const KvLayout& L = s.layout;
  const uint32_t rank = comm.rank(), R = comm.size();
  SessionState& st = shard_state(s, sh.shard[rank]);
  const DeviceGuard on(st.device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  const LayerStore view = shard_view(L, sh.layer, sh.ranges[rank]);
  DecodeBatch b{};
  b.shape = decode_shape(L);
  b.n_items = 1;
  set_method(sh.all_dense ? SSA_METHOD_DENSE : sh.p.method, &b);
  if (!sh.all_dense) set_group(sh.p, L.group_size(), &b);
  b.pi_min = sh.p.pi_min;
  b.layer = sh.layer_index;
  b.seed = sh.seed;
  b.step = sh.p.step;
  DecodeItem& it = b.items[0];
  it = shard_item(sh.global, sh.ranges[rank]);
  absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> tables = layer_tables(s, st, sh.layer_index, view, &it);
  if (!tables.ok()) return tables.status();
  it.q = sh.q;
  it.out = nullptr;  // the merge on the first device writes the output
  int sms = 0;
  SSA_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, st.device), "cudaDeviceGetAttribute");
  WorkspacePlan plan;
  SSA_CUDA_RETURN(plan_workspace(&b, sms, &plan), "decode planning");
  if (plan.n_splits > sh.cap) {
    b.n_splits = sh.cap;
    SSA_CUDA_RETURN(plan_workspace(&b, sms, &plan), "decode planning");
  }
  const cudaStream_t stream = st.stream;
  DeviceMem blob, bits;
  SSA_CUDA_RETURN(blob.alloc(plan.total_bytes, stream), "cudaMallocAsync of the decode workspace");
  const Workspace ws = bind_workspace(blob.p, plan);
  SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, sh.q_ready, 0), "decode ordering");
  const uint32_t ns = b.sel_heads();
  std::vector<uint64_t> heavy(ns, 0);
  // Rows are read back whole for the stats; the kernels set only what they use.
  if (sh.selects) SSA_CUDA_RETURN(cudaMemsetAsync(ws.rows, 0, plan.rows * sizeof(RowState), stream), "decode setup");
  // Also without a selection: the row states (a window-only item's read sets) are set here.
  SSA_CUDA_RETURN(run_shard_scores(b, plan, ws, stream), "proxy score kernels");
  if (sh.selects) {
    // The global top-k of every selection row, into the pipeline's heavy bitmap
    // (row h's words from h * n_pad / 32; candidate j = token sink_end + j).
    const uint32_t nc = it.local_begin > it.sink_end ? it.local_begin - it.sink_end : 0;
    const uint32_t words = (nc + 31) / 32;
    const ShardTopkRows rows{nc > 0 ? ws.scores + it.sink_end : ws.scores, ns, nc, it.n_pad};
    SSA_CUDA_RETURN(bits.alloc(size_t{ns} * std::max(words, 1u) * sizeof(uint32_t), stream),
                    "cudaMallocAsync of the heavy bitmap");
    SSA_RETURN_IF_ERROR(device_sharded_topk(comm, rows, std::vector<uint64_t>(ns, sh.global.n_heavy),
                                            sh.plan.candidates(), stream, static_cast<uint32_t*>(bits.p)));
    const size_t row_words = it.n_pad / 32;
    SSA_CUDA_RETURN(cudaMemsetAsync(ws.heavy_bits, 0, size_t{ns} * row_words * sizeof(uint32_t), stream),
                    "heavy bitmap setup");
    if (words > 0) {
      SSA_CUDA_RETURN(cudaMemcpy2DAsync(ws.heavy_bits, row_words * sizeof(uint32_t), bits.p,
                                        words * sizeof(uint32_t), words * sizeof(uint32_t), ns,
                                        cudaMemcpyDeviceToDevice, stream),
                      "heavy bitmap copy");
    }
    SSA_CUDA_RETURN(run_shard_read_sets(b, plan, ws, stream), "read set kernels");
  }
  SSA_CUDA_RETURN(run_split_partials(b, plan, ws, stream), "attention kernels");
  // Every rank's split count lays the partials end to end, in shard order (so in
  // token order), on the first device.
  uint64_t mine = plan.n_splits;
  std::vector<uint64_t> counts(R);
  SSA_RETURN_IF_ERROR(comm.all_gather(&mine, sizeof mine, counts.data()));
  uint64_t offset = 0, total = 0;
  for (uint32_t r = 0; r < R; ++r) {
    if (r < rank) offset += counts[r];
    total += counts[r];
  }
  if (rank == 0) sh.total_splits = static_cast<uint32_t>(total);
  const size_t rec = size_t{L.head_dim} + 2;
  SSA_CUDA_RETURN(cudaMemcpy2DAsync(sh.gather + offset * rec, total * rec * sizeof(float), ws.partial,
                                    plan.n_splits * rec * sizeof(float), plan.n_splits * rec * sizeof(float),
                                    L.n_q_heads, cudaMemcpyDefault, stream),
                  "partial output copy");
  std::vector<RowState> rs;
  if (sh.want_stats && sh.selects) {
    rs.resize(plan.rows);
    SSA_CUDA_RETURN(cudaMemcpyAsync(rs.data(), ws.rows, rs.size() * sizeof(RowState), cudaMemcpyDeviceToHost,
                                    stream),
                    "row state read-back");
  }
  SSA_CUDA_RETURN(cudaEventRecord(sh.done[rank], stream), "decode ordering");
  {
    absl::MutexLock lock(&st.mu);
    if ((*tables)->last_use.record(stream) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
    }
  }
  if (!rs.empty()) {
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
    for (uint32_t h = 0; h < ns; ++h) heavy[h] = rs[h].n_heavy;
  }
  if (sh.want_stats && sh.selects) {
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(heavy.data(), heavy.size()));
    if (rank == 0) sh.heavy = heavy;
  }
  return absl::OkStatus();
}

void add_stats(const Shared& sh, ssa_decode_stats* stats) {
  const KvLayout& L = sh.s.layout;
  const DecodePlan& pl = sh.plan;
  const uint32_t nq = L.n_q_heads, g = L.group_size();
  const bool grouped = sh.p.group_selection != SSA_GROUP_OFF;
  stats->context_tokens += pl.n;
  if (pl.window_only()) stats->window_only_heads += nq;
  const uint64_t always = pl.dense ? pl.n : pl.fixed_tokens();
  for (uint32_t h = 0; h < nq; ++h) {
    if (sh.all_dense) {
      stats->tokens_read += pl.n;
      if (!pl.dense) stats->heavy_tokens += pl.candidates();  // a group budget over every candidate
      continue;
    }
    const uint64_t heavy = sh.selects ? sh.heavy[grouped ? h / g : h] : 0;
    stats->tokens_read += always + heavy;
    stats->heavy_tokens += heavy;
    if ((!grouped || h % g == 0) && pl.kprime > 0) stats->scored_tokens += pl.candidates();
  }
}

}  // namespace

bool sharded_session(const ssa_session& s) { return shard_count(s) > 1; }

absl::Status sharded_decode(const LaunchJob& job, uint32_t layer_index, const ssa_decode_params& p, uint64_t seed,
                            ssa_decode_stats* stats) {
  const ssa_session& s = *job.s;
  const KvLayout& L = s.layout;
  if (job.plan.targeted) return unsupported(kShardedTargetUnsupported);
  Shared sh(s, *job.layer, layer_index, p, seed, job.plan);
  const uint32_t g = L.group_size();
  sh.all_dense = job.plan.dense || group_reads_all(job.plan, p, g);
  plan_item(job.plan, p, g, &sh.global);
  sh.selects = !sh.all_dense && sh.global.n_select > 0;
  if (sh.selects) {
    DecodeBatch m{};
    set_method(p.method, &m);
    set_group(p, g, &m);
    if (m.sampling != Sampling::kNone || m.heavy != HeavyRule::kFixed) {
      return unsupported("CUDA sharded sessions decode DENSE, ORACLE_TOPK and PQ_TOPK in this version; the "
                         "sampling methods (their proposal's global normaliser and draws placed by residual mass "
                         "over the shards) are not implemented: use one of those, or an unsharded runtime");
    }
    if (m.group == GroupProposal::kMixture) {
      return unsupported("group_selection MIXTURE of a CUDA sharded session is not implemented (its per-head "
                         "normalisers are global); use SSA_GROUP_MEAN_QUERY or SSA_GROUP_OFF");
    }
  }
  if (layer_has_host_pages(*job.layer)) {
    return unsupported("a CUDA sharded session with pages mapped from a snapshot file (SSA_LOAD_MMAP) is not "
                       "decoded in this version; load it without SSA_LOAD_MMAP");
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(stream, &cap), "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) {
    return unsupported("a decode of a CUDA sharded session on a stream being captured into a CUDA graph: its "
                       "shards exchange the selection through the host");
  }
  const std::vector<ShardRange> all = shard_ranges(job.layer->n_tokens, shard_count(s), s.rt->shard_tokens);
  for (uint32_t i = 0; i < all.size(); ++i) {
    if (all[i].size() == 0) continue;
    sh.shard.push_back(i);
    sh.ranges.push_back(all[i]);
  }
  const auto R = static_cast<uint32_t>(sh.shard.size());
  sh.cap = kMaxSplits / R;
  sh.want_stats = stats != nullptr;
  const size_t qbytes = size_t{L.n_q_heads} * L.row_bytes();
  const size_t rec = size_t{L.head_dim} + 2;
  const bool staged = host_buffers(s);
  DeviceMem stage, gather;
  if (staged) {
    SSA_CUDA_RETURN(stage.alloc(2 * qbytes, stream), "cudaMallocAsync of q/out staging");
    SSA_CUDA_RETURN(cudaMemcpyAsync(stage.p, job.q, qbytes, cudaMemcpyHostToDevice, stream), "q upload");
  }
  sh.q = staged ? stage.p : job.q;
  void* out = staged ? static_cast<uint8_t*>(stage.p) + qbytes : job.out;
  SSA_CUDA_RETURN(gather.alloc(size_t{L.n_q_heads} * R * sh.cap * rec * sizeof(float), stream),
                  "cudaMallocAsync of the shards' partials");
  sh.gather = static_cast<float*>(gather.p);
  Events events(1 + R);
  SSA_CUDA_RETURN(events.create(), "cudaEventCreate");
  sh.q_ready = events.e[0];
  sh.done.assign(events.e.begin() + 1, events.e.end());
  SSA_CUDA_RETURN(cudaEventRecord(sh.q_ready, stream), "decode ordering");
  InProcessGroup group(R);
  const absl::Status ranks = group.run([&](Collective& comm) { return rank_decode(sh, comm); });
  if (!ranks.ok()) {
    // Work a rank queued may still write the gather buffer, freed on the caller's stream.
    for (uint32_t r = 0; r < R; ++r) {
      const DeviceGuard on(shard_state(s, sh.shard[r]).device);
      if (cudaStreamSynchronize(shard_state(s, sh.shard[r]).stream) != cudaSuccess) cudaGetLastError();
    }
    return ranks;
  }
  for (cudaEvent_t e : sh.done) SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, e, 0), "decode ordering");
  DecodeBatch m{};
  m.shape = decode_shape(L);
  m.n_items = 1;
  m.overlap_launches = false;  // after event waits, not after a kernel
  m.items[0].out = out;
  WorkspacePlan mp{};
  mp.n_splits = sh.total_splits;
  Workspace mw{};
  mw.partial = sh.gather;
  SSA_CUDA_RETURN(run_merge_partials(m, mp, mw, stream), "merge kernel");
  if (staged) {
    SSA_CUDA_RETURN(cudaMemcpyAsync(job.out, out, qbytes, cudaMemcpyDeviceToHost, stream), "out download");
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  }
  if (stats != nullptr) add_stats(sh, stats);
  return absl::OkStatus();
}

}  // namespace ssa::cuda
