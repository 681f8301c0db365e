// The decode of a sharded CUDA session (docs/SHARDING.md): one rank per range of
// tokens, each a thread on the device of the shard holding its range's start,
// through the kernels of an unsharded decode with the selection made globally:
//   proxy scores of the range's candidates -> (sampling) the rows' maximum
//   all-reduced -> the global top-k over every range's scores
//   (device_sharded_topk.h: all-reduced radix histograms, ties to the lowest
//   tokens) as the range's heavy bitmap -> (sampling) the residual's block and
//   chunk sums, every range's residual total all-gathered so that the ranges lie
//   end to end in one global mass, the draws of the one Philox stream each kept
//   by the range its first-level target falls in -> the read sets and the
//   samples' log pi with the global total -> the split partials, copied to the
//   first device in token order -> one merge there.
// The heavy set and the samples are exactly the unsharded decode's: the sampler's
// hierarchy is cut at candidate offsets (1024-candidate chunks from sink_end), so
// a selecting decode's ranges start at the first chunk boundary at or after their
// shard's start: every chunk, block and bitmap word lies in one range, and a
// range reads the up to 1023 tokens it takes past its shard's end from the next
// shard's pages (peer access). The output
// differs from the unsharded one only by where the attention's splits fall
// (floating-point rounding). Not sharded here: the adaptive heavy rule, the
// mixture proposal, error-targeted decodes (SSA_ERR_UNSUPPORTED).
#include <cuda_runtime.h>
#include <stddef.h>

#include <algorithm>

#include "common/sampling_hierarchy.h"
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
  bool sampling = false;            // the selection draws samples of the residual
  // Per selection row, over all shards (rank 0): heavy and unique-sample counts,
  // the residual's and the heavy set's proxy masses.
  std::vector<uint64_t> heavy, unique;
  std::vector<double> resid_mass, heavy_mass;
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

// The ranks of a decode: one per shard holding tokens, its range starting at its
// shard's start, or (a selecting decode) at the first sampler chunk boundary at
// or after it (chunks of kChunkTokens candidates from sink_end), so that no
// chunk, block or bitmap word of the selection is split between ranks. A rank
// runs on the device of the shard holding its first token.
void plan_ranks(const ssa_session& s, uint64_t n_tokens, bool align, uint64_t sink_end, Shared* sh) {
  const std::vector<ShardRange> all = shard_ranges(n_tokens, shard_count(s), s.rt->shard_tokens);
  std::vector<uint64_t> starts;
  for (const ShardRange& r : all) {
    if (r.size() == 0) continue;
    uint64_t b = r.begin;
    if (align && b > 0) {
      b = b <= sink_end ? sink_end : sink_end + (b - sink_end + kChunkTokens - 1) / kChunkTokens * kChunkTokens;
    }
    starts.push_back(std::min(b, n_tokens));
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    const ShardRange range{starts[i], i + 1 < starts.size() ? starts[i + 1] : n_tokens};
    if (range.size() == 0) continue;
    uint32_t shard = 0;
    while (shard + 1 < all.size() && all[shard].end <= range.begin) ++shard;
    sh->shard.push_back(shard);
    sh->ranges.push_back(range);
  }
}

// Field [offset, offset + bytes) of each of n row states, to and from a host
// array of n such fields. Pageable host memory: the copy to the host is complete
// on return of a stream synchronisation, the copy from it once it returns.
cudaError_t row_fields_to_host(const RowState* rows, size_t offset, size_t bytes, uint32_t n, void* host,
                               cudaStream_t stream) {
  const cudaError_t e = cudaMemcpy2DAsync(host, bytes, reinterpret_cast<const uint8_t*>(rows) + offset,
                                          sizeof(RowState), bytes, n, cudaMemcpyDeviceToHost, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}
cudaError_t row_fields_from_host(RowState* rows, size_t offset, size_t bytes, uint32_t n, const void* host,
                                 cudaStream_t stream) {
  return cudaMemcpy2DAsync(reinterpret_cast<uint8_t*>(rows) + offset, sizeof(RowState), host, bytes, bytes, n,
                           cudaMemcpyHostToDevice, stream);
}

// The rows' maximum proxy score over every rank's candidates, into each rank's
// row states (the residual weights exp(s~ - max) of all ranks share it).
absl::Status share_row_max(Collective& comm, RowState* rows, uint32_t n, cudaStream_t stream) {
  std::vector<uint32_t> mine(n), all(size_t{comm.size()} * n);
  SSA_CUDA_RETURN(row_fields_to_host(rows, offsetof(RowState, max_key), sizeof(uint32_t), n, mine.data(), stream),
                  "row state read-back");
  SSA_RETURN_IF_ERROR(comm.all_gather(mine.data(), n * sizeof(uint32_t), all.data()));
  for (uint32_t r = 0; r < comm.size(); ++r)
    for (uint32_t h = 0; h < n; ++h) mine[h] = std::max(mine[h], all[size_t{r} * n + h]);
  SSA_CUDA_RETURN(row_fields_from_host(rows, offsetof(RowState, max_key), sizeof(uint32_t), n, mine.data(), stream),
                  "row state update");
  return absl::OkStatus();
}

// The residual draws of every row: the ranks' residual totals (cprefix's last
// chunk) laid end to end in rank order, so token order, as one mass; each rank
// keeps the draws whose first-level target falls in its part; then w_total is the
// global total, as the samples' log pi needs.
absl::Status draw_samples(Collective& comm, const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                          cudaStream_t stream) {
  const DecodeItem& it = b.items[0];
  const uint32_t n = b.sel_heads(), R = comm.size(), rank = comm.rank();
  SSA_CUDA_RETURN(run_shard_residual(b, plan, ws, stream), "residual kernels");
  const uint32_t nc = it.local_begin > it.sink_end ? it.local_begin - it.sink_end : 0;
  std::vector<uint64_t> mine(n, 0), all(size_t{R} * n);
  if (nc > 0) {
    const size_t pitch = size_t{it.n_pad / kChunkTokens} * sizeof(uint64_t);
    const uint64_t* last = ws.cprefix + (nc + kChunkTokens - 1) / kChunkTokens - 1;
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(mine.data(), sizeof(uint64_t), last, pitch, sizeof(uint64_t), n,
                                      cudaMemcpyDeviceToHost, stream),
                    "residual total read-back");
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  }
  SSA_RETURN_IF_ERROR(comm.all_gather(mine.data(), n * sizeof(uint64_t), all.data()));
  std::vector<uint64_t> mass(2 * size_t{n}, 0);  // per row: mass_begin, mass_total
  std::vector<double> w_total(n);
  for (uint32_t h = 0; h < n; ++h) {
    for (uint32_t r = 0; r < R; ++r) {
      if (r < rank) mass[2 * h] += all[size_t{r} * n + h];
      mass[2 * h + 1] += all[size_t{r} * n + h];
    }
    w_total[h] = static_cast<double>(mass[2 * h + 1]);
  }
  static_assert(offsetof(RowState, mass_total) == offsetof(RowState, mass_begin) + sizeof(uint64_t));
  SSA_CUDA_RETURN(row_fields_from_host(ws.rows, offsetof(RowState, mass_begin), 2 * sizeof(uint64_t), n,
                                       mass.data(), stream),
                  "row state update");
  SSA_CUDA_RETURN(run_shard_draws(b, plan, ws, stream), "sampling kernels");
  SSA_CUDA_RETURN(row_fields_from_host(ws.rows, offsetof(RowState, w_total), sizeof(double), n, w_total.data(),
                                       stream),
                  "row state update");
  return absl::OkStatus();
}

absl::Status rank_decode(Shared& sh, Collective& comm) {
  const ssa_session& s = sh.s;
  const KvLayout& L = s.layout;
  const uint32_t rank = comm.rank(), R = comm.size();
  SessionState& st = shard_state(s, sh.shard[rank]);
  const DeviceGuard on(st.device);
  SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
  const ShardRange range = sh.ranges[rank];
  const uint64_t view_begin = range.begin / L.page_tokens * L.page_tokens;
  const LayerStore view = shard_view(L, sh.layer, ShardRange{view_begin, range.end});
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
  it = rank_item(sh.global, range, view_begin);
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
  std::vector<uint64_t> heavy(ns, 0), unique(ns, 0);
  std::vector<double> masses(2 * size_t{ns}, 0.0);  // per row: residual, heavy proxy mass
  // Rows are read back whole for the stats; the kernels set only what they use.
  if (sh.selects) SSA_CUDA_RETURN(cudaMemsetAsync(ws.rows, 0, plan.rows * sizeof(RowState), stream), "decode setup");
  // Also without a selection: the row states (a window-only item's read sets) are set here.
  SSA_CUDA_RETURN(run_shard_scores(b, plan, ws, stream), "proxy score kernels");
  if (sh.selects) {
    if (sh.sampling) SSA_RETURN_IF_ERROR(share_row_max(comm, ws.rows, ns, stream));
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
    if (sh.sampling) SSA_RETURN_IF_ERROR(draw_samples(comm, b, plan, ws, stream));
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
    for (uint32_t h = 0; h < ns; ++h) {
      heavy[h] = rs[h].n_heavy;
      unique[h] = rs[h].n_unique;
      masses[2 * h] = rs[h].w_resid_proxy;
      masses[2 * h + 1] = rs[h].w_heavy;
    }
  }
  if (sh.want_stats && sh.selects) {
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(heavy.data(), heavy.size()));
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(unique.data(), unique.size()));
    std::vector<double> all(masses.size() * R);
    SSA_RETURN_IF_ERROR(comm.all_gather(masses.data(), masses.size() * sizeof(double), all.data()));
    if (rank == 0) {
      sh.heavy = heavy;
      sh.unique = unique;
      sh.resid_mass.assign(ns, 0.0);
      sh.heavy_mass.assign(ns, 0.0);
      for (uint32_t r = 0; r < R; ++r) {
        for (uint32_t h = 0; h < ns; ++h) {
          sh.resid_mass[h] += all[r * masses.size() + 2 * h];
          sh.heavy_mass[h] += all[r * masses.size() + 2 * h + 1];
        }
      }
    }
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
    const uint32_t row = grouped ? h / g : h;
    const uint64_t heavy = sh.selects ? sh.heavy[row] : 0;
    const uint64_t unique = sh.selects && sh.sampling ? sh.unique[row] : 0;
    stats->tokens_read += always + heavy + unique;
    stats->heavy_tokens += heavy;
    if ((!grouped || h % g == 0) && pl.kprime > 0) stats->scored_tokens += pl.candidates();
    if (sh.selects && sh.sampling) {
      // Every row's m: its selection less the fixed heavy count (row_init.cuh).
      stats->draws += sh.global.n_select - sh.global.n_heavy;
      stats->unique_samples += unique;
      const double total = sh.resid_mass[row] + sh.heavy_mass[row];
      stats->residual_proxy_mass += total > 0 ? sh.resid_mass[row] / total : 0.0;
    }
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
    if (m.heavy != HeavyRule::kFixed) {
      return unsupported("SSA_METHOD_SSA_ADAPTIVE on a CUDA sharded session is not implemented (its heavy set "
                         "is decided per row from the candidates' mass over every shard); use SSA_METHOD_SSA, "
                         "or an unsharded runtime");
    }
    sh.sampling = m.sampling != Sampling::kNone;
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
  plan_ranks(s, job.layer->n_tokens, sh.selects, sh.global.sink_end, &sh);
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
