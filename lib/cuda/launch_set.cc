// Decode on the device: items grouped by shape (and memory space) into launch
// sets of up to kMaxBatchItems items of any lengths, each one run of the kernel
// pipeline (kernels/cuda_decode.h), and the stats read back from its row states.
#include <cuda_runtime.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "cuda_backend.h"
#include "decode/decode.h"
#include "decode/decode_plan.h"
#include "device_error.h"
#include "device_state.h"
#include "file_staging.h"
#include "kernels/cuda_decode.h"
#include "kernels/tier_accounting.h"
#include "launch_set.h"
#include "method_plan.h"

namespace ssa::cuda {

using Job = LaunchJob;

// Counted as the CPU counts them (docs/GROUP_SELECTION.md): every q head
// uses all of its selection row's rows; the scores computed are counted once
// per selection row (G per candidate for the mixture).
void add_set_stats(const std::vector<DecodePlan>& plans, const DecodeBatch& b, const std::vector<RowState>& rows,
                   const std::vector<unsigned long long>& counts, const KvLayout& layout,
                   const ssa_decode_params& p, ssa_decode_stats* stats) {
  const uint32_t g = layout.group_size();
  const uint32_t nq = layout.n_q_heads, ns = b.sel_heads();
  const uint64_t scores_per_candidate = p.group_selection == SSA_GROUP_MIXTURE ? g : 1;
  for (size_t i = 0; i < plans.size(); ++i) {
    const DecodePlan& pl = plans[i];
    const bool dense_job = pl.dense || group_reads_all(pl, p, g);
    stats->context_tokens += pl.n;
    if (!counts.empty()) {
      stats->rows_from_host += counts[2 * i];
      stats->host_cache_hits += counts[2 * i + 1];
    }
    if (pl.window_only()) stats->window_only_heads += nq;
    const uint64_t always = pl.dense ? pl.n : pl.sink_end + (pl.n - pl.local_begin);
    for (uint32_t h = 0; h < nq; ++h) {
      if (dense_job || b.proxy == Proxy::kNone) {
        stats->tokens_read += pl.n;
        // A group budget over every candidate: all of them, as heavy rows.
        if (!pl.dense) stats->heavy_tokens += pl.candidates();
        continue;
      }
      const uint32_t sh = b.sel_head_of(h);
      const RowState& r = rows[i * ns + sh];
      stats->tokens_read += always + r.n_heavy + r.n_unique;
      stats->heavy_tokens += r.n_heavy;
      const bool counts_scores = !b.grouped() || h % g == 0;  // the group's first head
      if (counts_scores && pl.kprime > 0) stats->scored_tokens += pl.candidates() * scores_per_candidate;
      if (b.sampling != Sampling::kNone) {
        stats->draws += r.n_draws;
        stats->unique_samples += r.n_unique;
        const double total = r.w_resid_proxy + r.w_heavy;
        stats->residual_proxy_mass += total > 0 ? r.w_resid_proxy / total : 0.0;
      }
    }
  }
}

cudaError_t queue_tier_counts(const DecodeBatch& b, const Workspace& ws, TierBatch& tb, uint32_t n_items,
                              cudaStream_t stream, DeviceMem* device, std::vector<unsigned long long>* counts) {
  cudaError_t e = cudaSuccess;
  if (counts != nullptr) {
    counts->assign(2 * size_t{n_items}, 0);
    const size_t bytes = counts->size() * sizeof(unsigned long long);
    e = device->alloc(bytes, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(device->p, 0, bytes, stream);
    for (uint32_t i = 0; i < n_items; ++i) {
      if (tb.items[i].page_tier != nullptr) tb.items[i].counts = static_cast<unsigned long long*>(device->p) + 2 * i;
    }
  }
  if (e == cudaSuccess) e = launch_tier_accounting(b, ws, tb, stream);
  if (e == cudaSuccess && counts != nullptr) {
    e = cudaMemcpyAsync(counts->data(), device->p, counts->size() * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, stream);
  }
  return e;
}

// One launch set over jobs of one shape; stats (optional) summed over the jobs.
absl::Status run_launch_set(const std::vector<Job>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                            uint64_t seed, ssa_decode_stats* stats, LaunchHook* hook) {
  const ssa_session& s0 = *jobs[0].s;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  DecodeBatch b{};
  b.shape = decode_shape(s0.layout);
  b.n_items = static_cast<uint32_t>(jobs.size());
  const uint32_t g = s0.layout.group_size();
  // Dense items: the planner's, and with group selection those whose group
  // budget covers every candidate (read exactly, as on the CPU).
  auto dense_job = [&](const Job& j) { return j.plan.dense || group_reads_all(j.plan, p, g); };
  bool all_dense = true;
  for (const Job& j : jobs) all_dense = all_dense && dense_job(j);
  set_method(all_dense ? SSA_METHOD_DENSE : p.method, &b);
  if (!all_dense) set_group(p, g, &b);
  if (b.sampling != Sampling::kNone) {
    for (const Job& j : jobs) {
      if (!dense_job(j) && j.plan.candidates() > kMaxSampledCandidates)
        return absl::UnimplementedError(
            "CUDA backend: sampling over 2^26 or more candidate tokens in one session");
    }
  }
  b.pi_min = p.pi_min;
  b.layer = layer_index;
  b.seed = seed;
  b.step = p.step;
  b.record_draws = hook != nullptr && hook->record_draws();
  const size_t qbytes = size_t{s0.layout.n_q_heads} * s0.layout.row_bytes();
  const bool staged = host_buffers(s0);
  DeviceMem stage;
  if (staged) SSA_CUDA_RETURN(stage.alloc(2 * qbytes * jobs.size(), stream), "cudaMallocAsync of q/out staging");
  // Pages mapped from a snapshot file that the device cannot read: the decode
  // stops after the selection for the host to copy the rows it reads, which a
  // graph cannot replay (checked before anything is queued).
  for (const Job& j : jobs) {
    if (!stages_file_rows(*j.s, *j.layer)) continue;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    SSA_CUDA_RETURN(cudaStreamIsCapturing(stream, &cap), "cudaStreamIsCapturing");
    if (cap != cudaStreamCaptureStatusNone) {
      return invalid_argument(kCapturedFileRows);
    }
  }
  std::vector<std::shared_ptr<SessionState::LayerCache>> tables(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    DecodeItem& it = b.items[i];
    absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> t = layer_tables(*j.s, layer_index, *j.layer, &it);
    if (!t.ok()) return t.status();
    tables[i] = *std::move(t);
    if (staged) {
      uint8_t* base = static_cast<uint8_t*>(stage.p) + 2 * qbytes * i;
      SSA_CUDA_RETURN(cudaMemcpyAsync(base, j.q, qbytes, cudaMemcpyHostToDevice, stream), "q upload");
      it.q = base;
      it.out = base + qbytes;
    } else {
      it.q = j.q;
      it.out = j.out;
    }
    plan_item(j.plan, p, g, &it);
  }
  std::vector<FileStageItem> file_items;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (stages_file_rows(*jobs[i].s, *jobs[i].layer))
      file_items.push_back({static_cast<uint32_t>(i), jobs[i].s, jobs[i].layer, tables[i].get()});
  }
  int sms = 0;
  SSA_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state(s0).device),
                  "cudaDeviceGetAttribute");
  WorkspacePlan plan;
  SSA_CUDA_RETURN(plan_workspace(&b, sms, &plan), "decode planning");
  void* blob = nullptr;
  SSA_CUDA_RETURN(device_malloc_async(&blob, plan.total_bytes, stream), "cudaMallocAsync of the decode workspace");
  const Workspace ws = bind_workspace(blob, plan);
  // The stats (and a hook's estimate) read every row's state back whole; a
  // method's kernels set only the fields it uses, so the others are zeroed to be
  // defined.
  const bool read_rows = (stats != nullptr || hook != nullptr) && !all_dense;
  cudaError_t e = read_rows ? cudaMemsetAsync(ws.rows, 0, plan.rows * sizeof(RowState), stream) : cudaSuccess;
  FileStage file_stage;
  absl::Status staging = absl::OkStatus();
  if (file_items.empty()) {
    if (e == cudaSuccess) e = run_decode(b, plan, ws, stream);
  } else {
    const bool whole_pages = b.proxy == Proxy::kExact;  // its scores read every key
    if (e == cudaSuccess && whole_pages) staging = stage_file_rows(file_items, &b, nullptr, stream, &file_stage);
    if (e == cudaSuccess && staging.ok()) e = run_selection(b, plan, ws, stream);
    if (e == cudaSuccess && staging.ok() && !whole_pages) {
      staging = stage_file_rows(file_items, &b, &ws, stream, &file_stage);
    }
    if (e == cudaSuccess && staging.ok()) e = run_attention_stage(b, plan, ws, stream);
    if (!staging.ok()) {
      // Queued selection kernels read the tables: done before they may go.
      cudaStreamSynchronize(stream);
      cudaFreeAsync(blob, stream);
      return staging;
    }
  }
  if (e == cudaSuccess && hook != nullptr) e = hook->after_decode(b, plan, ws, stream);
  // Tiered sessions: what was read from which tier (stats, and the read-back
  // the placement and the cache of host pages learn from).
  bool any_tiered = false;
  for (const auto& t : tables) any_tiered = any_tiered || t->tiered;
  DeviceMem tier_counts;
  std::vector<unsigned long long> counts;
  if (e == cudaSuccess && any_tiered) {
    TierBatch tb{};
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!tables[i]->tiered) continue;
      tb.items[i].page_tier = static_cast<const uint8_t*>(tables[i]->tier_table.p);
      tb.items[i].page_rows = static_cast<uint32_t*>(tables[i]->page_rows.p);
    }
    e = queue_tier_counts(b, ws, tb, static_cast<uint32_t>(jobs.size()), stream, &tier_counts,
                          stats != nullptr ? &counts : nullptr);
    for (size_t i = 0; i < jobs.size() && e == cudaSuccess; ++i) {
      if (tables[i]->tiered) e = queue_tier_readback(*jobs[i].s, *tables[i], stream);
    }
  }
  std::vector<RowState> rows;
  if (e == cudaSuccess && stats != nullptr && !all_dense) {
    rows.resize(plan.rows);
    e = cudaMemcpyAsync(rows.data(), ws.rows, rows.size() * sizeof(RowState), cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess && staged) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      e = cudaMemcpyAsync(jobs[i].out, b.items[i].out, qbytes, cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) break;
    }
  }
  cudaFreeAsync(blob, stream);
  if (e != cudaSuccess) return device_error(e, "decode kernels");
  // What the queued kernels read stays alive until they have run. Should an
  // event not be recorded, the decode is waited for instead.
  for (size_t i = 0; i < jobs.size(); ++i) {
    SessionState& st = state(*jobs[i].s);
    absl::MutexLock lock(&st.mu);
    if (tables[i]->last_use.record(stream) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
    }
  }
  // Staged file rows are pinned pages the attention reads: kept until it has run.
  if (staged || stats != nullptr || hook != nullptr || !file_items.empty())
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  if (stats != nullptr) {
    std::vector<DecodePlan> plans;
    for (const Job& j : jobs) plans.push_back(j.plan);
    add_set_stats(plans, b, rows, counts, s0.layout, p, stats);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                                       const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                                       ssa_decode_stats* stats, std::vector<HeadTrace>*, DecodeProfile*) const {
  SSA_CUDA_RETURN(cudaSetDevice(state(s).device), "cudaSetDevice");
  const Job job{&s, &layer, q, out, plan_decode(layer.n_tokens, p)};
  if (sharded_session(s)) return sharded_decode({job}, layer_index, p, seed, stats);
  if (job.plan.targeted) return targeted_decode(job, layer_index, p, seed, stats);
  return run_launch_set({job}, layer_index, p, seed, stats);
}

absl::Status CudaBackend::decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                                       const ssa_decode_params& p) const {
  if (p.target_error > 0.0f) return unsupported(kBatchNoErrorTarget);
  // A rank of a group of processes: every item is a collective call, made in
  // item order (the ranks' exchanges, trainings on demand included, must come
  // in one order), as ssa_decode.
  if (items[0].session->rt->group != nullptr) {
    for (size_t i = 0; i < n_items; ++i) {
      const absl::Status st = decode(*items[i].session, layer, items[i].q, items[i].out, p, nullptr);
      if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
    }
    return absl::OkStatus();
  }
  // Proxy methods need an index on every layer decoded (trained on demand).
  std::vector<ssa_session*> sessions;
  for (size_t i = 0; i < n_items; ++i) sessions.push_back(items[i].session);
  std::sort(sessions.begin(), sessions.end());
  sessions.erase(std::unique(sessions.begin(), sessions.end()), sessions.end());
  for (ssa_session* s : sessions) {
    bool needs = false;
    {
      std::shared_lock lock(s->mu);
      const LayerStore& l = s->layers[layer];
      if (l.n_tokens == 0) return invalid_argument("layer ", layer, " holds no tokens");
      const DecodePlan plan = plan_decode(l.n_tokens, p);
      needs = plan_needs_index(plan, p.method) && l.codebooks == nullptr;
    }
    if (needs) SSA_RETURN_IF_ERROR(session_ensure_index(*s, layer));
  }
  // Shared locks on every distinct session (sorted by address: one global
  // order), released on every path out, early returns included.
  std::vector<std::shared_lock<RwLock>> locks;
  locks.reserve(sessions.size());
  for (ssa_session* s : sessions) locks.emplace_back(s->mu);
  const uint64_t seed = p.seed != 0 ? p.seed : sessions[0]->rt->seed;
  SSA_CUDA_RETURN(cudaSetDevice(state(*sessions[0]).device), "cudaSetDevice");
  std::vector<Job> jobs;
  for (size_t i = 0; i < n_items; ++i) {
    const ssa_session& b = *items[i].session;
    const LayerStore& l = b.layers[layer];
    jobs.push_back(Job{&b, &l, items[i].q, items[i].out, plan_decode(l.n_tokens, p)});
  }
  // Every session of the runtime is sharded, or none is.
  if (sharded_session(*sessions[0])) return sharded_decode(jobs, layer, p, seed, nullptr);
  for (const std::vector<Job>& set : launch_sets(jobs)) SSA_RETURN_IF_ERROR(run_launch_set(set, layer, p, seed, nullptr));
  return absl::OkStatus();
}

std::vector<std::vector<LaunchJob>> launch_sets(const std::vector<LaunchJob>& jobs) {
  std::vector<std::vector<LaunchJob>> sets;
  std::vector<bool> done(jobs.size(), false);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (done[i]) continue;
    std::vector<LaunchJob> set;
    const ssa_session& a = *jobs[i].s;
    for (size_t j = i; j < jobs.size() && set.size() < kMaxBatchItems; ++j) {
      const ssa_session& b = *jobs[j].s;
      if (done[j] || memcmp(&a.layout, &b.layout, sizeof(KvLayout)) != 0 || host_buffers(a) != host_buffers(b))
        continue;
      done[j] = true;
      set.push_back(jobs[j]);
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

}  // namespace ssa::cuda
