// Decode steps on the device (graph_step.h): reserve, settle, and the step
// itself, queued the same way eagerly and under capture: the plan kernel, the
// row copy, the codes, the decode stages (planned on the host once for the
// reservation's capacity, reading the device-planned items), and an event
// record the host waits on when it settles.
#include "graph_step.h"

#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "budget_trade.h"
#include "cuda_backend.h"
#include "decode/decode_plan.h"
#include "device_error.h"
#include "device_tiers.h"
#include "kernels/cuda_decode.h"
#include "kernels/step_plan.h"
#include "launch_set.h"
#include "method_plan.h"
#include "session.h"

namespace ssa::cuda {
namespace {

// The guard slots: one table per device for the life of the process, because a
// step captured into a graph may be replayed after its session (and the
// session's memory) is gone, and must find out from the guard alone. Plain
// cudaMalloc, not the library's pool, which is trimmed when sessions are
// destroyed. Slots are handed out round robin; generations are unique for the
// process, so a reused slot never matches an old step.
constexpr uint32_t kGuardSlots = 65536;  // 1 MiB per device

struct GuardTables {
  std::mutex mu;
  std::map<int, std::pair<StepGuard*, uint32_t>> by_device;  // table, next slot
};

GuardTables& guard_tables() {
  static GuardTables* t = new GuardTables;  // never destroyed: replays may outlive everything else
  return *t;
}

std::atomic<unsigned long long> g_generation{0};
unsigned long long next_generation() { return ++g_generation; }  // 0 is never a live generation

absl::StatusOr<StepGuard*> take_guard(int device) {
  GuardTables& t = guard_tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto& e = t.by_device[device];
  if (e.first == nullptr) {
    void* p = nullptr;
    SSA_CUDA_RETURN(cudaMalloc(&p, kGuardSlots * sizeof(StepGuard)), "cudaMalloc of the decode-step guards");
    const cudaError_t z = cudaMemset(p, 0, kGuardSlots * sizeof(StepGuard));
    if (z != cudaSuccess) {
      cudaFree(p);
      return device_error(z, "decode-step guards");
    }
    e.first = static_cast<StepGuard*>(p);
  }
  return e.first + (e.second++ % kGuardSlots);
}

// The events steps record (one per session that reserved): a graph captured
// with a session's event records it at every replay, also after the session
// is gone, so events are never destroyed but handed to later sessions. A stale
// replay recording a reused event only makes that session's next settle wait
// for the stale (idle) step too.
struct StepEvents {
  std::mutex mu;
  std::map<int, std::vector<cudaEvent_t>> free_by_device;
};

StepEvents& step_events() {
  static StepEvents* e = new StepEvents;  // never destroyed, as the guards
  return *e;
}

absl::StatusOr<cudaEvent_t> take_step_event(int device) {
  StepEvents& ev = step_events();
  {
    std::lock_guard<std::mutex> lock(ev.mu);
    std::vector<cudaEvent_t>& free = ev.free_by_device[device];
    if (!free.empty()) {
      const cudaEvent_t e = free.back();
      free.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  SSA_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

// The host calls around steps wait and copy; they must not disturb a capture
// that the calling thread (or another) has going on some other stream.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Sets the guard to `generation` with its counters cleared (complete on return).
absl::Status write_guard(SessionState& st, unsigned long long generation) {
  const StepGuard g{generation, 0, 0};
  SSA_CUDA_RETURN(cudaMemcpyAsync(st.guard, &g, sizeof g, cudaMemcpyHostToDevice, st.stream), "step guard");
  SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "step guard");
  return absl::OkStatus();
}

// The budget of `sparsity` or `budget` at n tokens (decode/decode_plan.cc).
uint64_t budget_at(uint64_t n, const ssa_decode_params& p) {
  return p.budget != 0 ? p.budget : static_cast<uint64_t>(ceil(static_cast<double>(n) / p.sparsity));
}

const char* unreservable(const ssa_session& s) {
  if (shard_count(s) > 1) return "sharded sessions (their decodes exchange selections between threads)";
  if (s.rt->group != nullptr) return "sessions of a group of processes (their decodes are collective calls)";
  if (host_buffers(s)) return "sessions with SSA_SESSION_HOST_POINTERS (their buffers are staged by the host)";
  // Host pages of a tiered session are pinned and mapped: steps read them in place.
  for (const LayerStore& l : s.layers) {
    for (const PageRef& pg : l.kv_pages) {
      if (pg->tier() == PageTier::kFile) return "sessions with pages mapped from a snapshot file (SSA_LOAD_MMAP)";
    }
  }
  return nullptr;
}


// One layer of a reservation: its tail (tiered sessions: older pages make room
// on the device first, as for an append) and the tables the steps read. A
// tiered layer's kv table is the decode's tier view (cached copies included)
// up to the tail, then the tail's pages; those are never cached while the
// reservation lasts.
absl::Status reserve_layer(ssa_session& s, uint32_t l, uint64_t n_tokens, StepReservation::Layer* out) {
  SessionState& st = state(s);
  const KvLayout& L = s.layout;
  LayerStore& layer = s.layers[l];
  if (layer.codebooks == nullptr) return internal_error("layer ", l, " reached the reservation without an index");
  StepReservation::Layer& R = *out;
  R.capacity = layer.n_tokens + n_tokens;
  R.first_tokens = layer.n_tokens;
  // The partly filled last page is made the session's own (copied if shared),
  // as for an append: the steps write into it.
  SSA_RETURN_IF_ERROR(s.backend->gather_tail(s, layer, R.capacity, true, &R.tail));
  std::vector<PageRef> code(layer.code_pages.begin(), layer.code_pages.begin() + R.tail.first_page);
  code.insert(code.end(), R.tail.code.begin(), R.tail.code.end());
  SSA_RETURN_IF_ERROR(upload_table(code, false, st.stream, &R.code_table));
  if (!st.kv_pool->tiered()) {
    std::vector<PageRef> kv(layer.kv_pages.begin(), layer.kv_pages.begin() + R.tail.first_page);
    kv.insert(kv.end(), R.tail.kv.begin(), R.tail.kv.end());
    SSA_RETURN_IF_ERROR(upload_table(kv, false, st.stream, &R.kv_table));
  } else {
    std::vector<const uint8_t*> entries;
    std::vector<uint8_t> tiers;
    {
      absl::MutexLock lock(&st.mu);
      set_steps_write_from(st, l, L.n_layers, R.tail.first_page);
      SSA_RETURN_IF_ERROR(tier_view(st, l, layer, &entries, &tiers, &R.memory));
    }
    entries.resize(R.tail.first_page);
    tiers.resize(R.tail.first_page);
    for (const PageRef& pg : R.tail.kv) {
      entries.push_back(pg->data());
      tiers.push_back(pg->tier() == PageTier::kDevice ? kTierDevice : kTierHost);
      R.memory.push_back(pg->keeper());
    }
    R.tiered = true;
    R.n_pages = entries.size();
    SSA_RETURN_IF_ERROR(upload_array(entries.data(), entries.size() * sizeof(void*), st.stream, &R.kv_table));
    SSA_RETURN_IF_ERROR(upload_array(tiers.data(), tiers.size(), st.stream, &R.tier_table));
    SSA_CUDA_RETURN(R.page_rows.alloc(R.n_pages * sizeof(uint32_t), st.stream), "cudaMallocAsync of the tier accounting");
    SSA_CUDA_RETURN(cudaMemsetAsync(R.page_rows.p, 0, R.n_pages * sizeof(uint32_t), st.stream), "tier accounting setup");
  }
  absl::MutexLock lock(&st.mu);
  absl::StatusOr<std::shared_ptr<SessionState::Books>> b = st.device_books(layer.codebooks);
  if (!b.ok()) return b.status();
  R.books = *std::move(b);
  return absl::OkStatus();
}

// The reservation's lengths, guard and event; complete on return.
absl::Status arm_reservation(SessionState& st, const std::vector<uint32_t>& lengths, StepReservation* r) {
  SSA_RETURN_IF_ERROR(upload_array(lengths.data(), lengths.size() * sizeof(uint32_t), st.stream, &r->lengths));
  if (st.guard == nullptr) {
    absl::StatusOr<StepGuard*> g = take_guard(st.device);
    if (!g.ok()) return g.status();
    st.guard = *g;
  }
  if (st.step_done == nullptr) {
    absl::StatusOr<cudaEvent_t> e = take_step_event(st.device);
    if (!e.ok()) return e.status();
    st.step_done = *e;
  }
  r->generation = next_generation();
  SSA_RETURN_IF_ERROR(write_guard(st, r->generation));
  // Page copies of gather_tail (legacy default stream) and the uploads: done
  // before any step, on whatever stream, may write the pages.
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "reserve");
  return absl::OkStatus();
}

// The layers' pages may be cached again (the reservation ended or was not made).
void end_tiered_steps(ssa_session& s) {
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) set_steps_write_from(st, l, s.layout.n_layers, UINT64_MAX);
}

}  // namespace

void return_step_event(int device, cudaEvent_t e) {
  StepEvents& ev = step_events();
  std::lock_guard<std::mutex> lock(ev.mu);
  ev.free_by_device[device].push_back(e);
}

void retire_steps(SessionState& st) {
  if (st.reservation == nullptr) return;
  cudaSetDevice(st.device);
  RelaxedCapture relaxed;
  // Destroy cannot fail: on an error the pages go anyway, as with a decode that failed.
  if (cudaEventSynchronize(st.step_done) != cudaSuccess) cudaGetLastError();
  if (!write_guard(st, next_generation()).ok()) cudaGetLastError();
  st.reservation.reset();
  st.steps_reserved = false;
}

bool CudaBackend::has_steps(const ssa_session& s) const { return state(s).steps_reserved.load(); }

absl::Status CudaBackend::check_eager_step(const ssa_decode_params& p) const {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(static_cast<cudaStream_t>(p.stream), &cap), "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) {
    return invalid_argument("the stream is being captured into a CUDA graph, but the session has no reservation: "
                            "its step would append on the host at the call, which a replay cannot repeat; call "
                            "ssa_session_reserve first");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::check_reservable(const ssa_session& s) const {
  if (const char* why = unreservable(s)) return unsupported("ssa_session_reserve is not available for ", why);
  return absl::OkStatus();
}

absl::Status CudaBackend::reserve_steps(ssa_session& s, uint64_t n_tokens) const {
  SSA_RETURN_IF_ERROR(check_reservable(s));
  SessionState& st = state(s);
  SSA_CUDA_RETURN(cudaSetDevice(st.device), "cudaSetDevice");
  RelaxedCapture relaxed;
  const KvLayout& L = s.layout;
  auto r = std::make_shared<StepReservation>();
  for (uint32_t l = 0; l < L.n_layers; ++l) r->layers.push_back(std::make_unique<StepReservation::Layer>());
  std::vector<uint32_t> lengths(L.n_layers);
  const bool tiered = st.kv_pool->tiered();
  // Its pages come in (idle sessions' go out) before the layers' tables freeze.
  absl::Status made = tiered ? take_turn(s, n_tokens) : absl::OkStatus();
  for (uint32_t l = 0; l < L.n_layers && made.ok(); ++l) made = reserve_layer(s, l, n_tokens, r->layers[l].get());
  if (made.ok()) {
    for (uint32_t l = 0; l < L.n_layers; ++l) lengths[l] = static_cast<uint32_t>(s.layers[l].n_tokens);
    made = arm_reservation(st, lengths, r.get());
  }
  if (!made.ok()) {
    if (tiered) end_tiered_steps(s);
    return made;
  }
  st.reservation = std::move(r);
  st.steps_reserved = true;
  return absl::OkStatus();
}

absl::Status CudaBackend::prefetch_turn(ssa_session& s, uint64_t n_tokens) const {
  SessionState& st = state(s);
  if (!st.kv_pool->tiered()) return absl::OkStatus();
  SSA_CUDA_RETURN(cudaSetDevice(st.device), "cudaSetDevice");
  RelaxedCapture relaxed;
  return start_turn(s, n_tokens);
}

absl::Status CudaBackend::settle_steps(ssa_session& s, bool end, uint64_t* dropped) const {
  SessionState& st = state(s);
  if (st.guard == nullptr) {  // never reserved
    if (dropped != nullptr) *dropped = 0;
    return absl::OkStatus();
  }
  SSA_CUDA_RETURN(cudaSetDevice(st.device), "cudaSetDevice");
  RelaxedCapture relaxed;
  // The last step queued or replayed (also of an ended reservation: its
  // replays count what they dropped in the guard).
  SSA_CUDA_RETURN(cudaEventSynchronize(st.step_done), "waiting for the session's decode steps");
  StepGuard g{};
  SSA_CUDA_RETURN(cudaMemcpyAsync(&g, st.guard, sizeof g, cudaMemcpyDeviceToHost, st.stream), "step guard");
  std::vector<uint32_t> lengths(s.layout.n_layers);
  StepReservation* r = st.reservation.get();
  if (r != nullptr) {
    SSA_CUDA_RETURN(cudaMemcpyAsync(lengths.data(), r->lengths.p, lengths.size() * sizeof(uint32_t),
                                    cudaMemcpyDeviceToHost, st.stream), "decode-step lengths");
  }
  SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "decode-step lengths");
  for (uint32_t l = 0; r != nullptr && l < s.layout.n_layers; ++l) {
    const StepReservation::Layer& R = *r->layers[l];
    if (lengths[l] < s.layers[l].n_tokens || lengths[l] > R.capacity) {
      return internal_error("decode steps left layer ", l, " at ", lengths[l], " tokens (", s.layers[l].n_tokens,
                            " committed, capacity ", R.capacity, ")");
    }
  }
  if (end && r != nullptr && r->layers[0]->tiered) {
    // What all of the reservation's steps read, for the placement and the cache
    // (taken in when the next reservation or decode builds its tables). Only at
    // the end: pages move and the cache changes between reservations, and a
    // settle per step (a model's generate loop) would otherwise leave only its
    // last step's reads to be taken in, at a read-back per layer and step.
    absl::MutexLock lock(&st.mu);
    for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
      const StepReservation::Layer& R = *r->layers[l];
      const uint64_t steps = lengths[l] - R.first_tokens;
      if (steps == 0) continue;
      SSA_CUDA_RETURN(queue_page_reads(st, l, s.layout.n_layers, static_cast<uint32_t*>(R.page_rows.p), R.n_pages,
                                       steps, st.stream), "tier accounting read-back");
    }
    SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "tier accounting read-back");
  }
  for (uint32_t l = 0; r != nullptr && l < s.layout.n_layers; ++l) {
    LayerStore& layer = s.layers[l];
    const StepReservation::Layer& R = *r->layers[l];
    if (lengths[l] == layer.n_tokens) continue;
    // The tail's pages up to the device length; the layer's lists were reserved
    // up to the capacity by gather_tail, so this cannot fail.
    const uint64_t pages = s.layout.pages_for(lengths[l]) - R.tail.first_page;
    LayerTail part;
    part.first_page = R.tail.first_page;
    part.kv.assign(R.tail.kv.begin(), R.tail.kv.begin() + pages);
    part.code.assign(R.tail.code.begin(), R.tail.code.begin() + pages);
    part.new_n = lengths[l];
    commit_tail(std::move(part), &layer);
  }
  st.steps_dropped += uint64_t{g.dropped_ended} + g.dropped_full;
  if (dropped != nullptr) {
    *dropped = st.steps_dropped;
    st.steps_dropped = 0;
  }
  // The counters are cleared; ending moves the generation on.
  const unsigned long long generation = r == nullptr ? g.generation : end ? next_generation() : r->generation;
  SSA_RETURN_IF_ERROR(write_guard(st, generation));
  if (end && r != nullptr) {
    if (r->layers[0]->tiered) end_tiered_steps(s);
    st.reservation.reset();  // unused pages back to the pools; tables and lengths freed
    st.steps_reserved = false;
  }
  return absl::OkStatus();
}

namespace {

// One launch set of steps: items [0, n) of one shape, each with a reservation.
absl::Status queue_step_set(const ssa_decode_step_item* items, uint32_t n, uint32_t layer_index,
                            const ssa_decode_params& p, uint64_t seed, int sms, bool capturing,
                            ssa_decode_stats* stats) {
  const ssa_session& s0 = *items[0].session;
  const KvLayout& L = s0.layout;
  const uint32_t g = L.group_size();
  const bool grouped = p.group_selection != SSA_GROUP_OFF;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  DecodeBatch b{};
  b.shape = decode_shape(L);
  b.n_items = n;
  set_method(p.method, &b);
  if (p.method != SSA_METHOD_DENSE) set_group(p, g, &b);
  b.pi_min = p.pi_min;
  b.layer = layer_index;
  b.seed = seed;
  b.step = p.step;
  StepBatch sb{};
  sb.n_items = n;
  sb.req.method = static_cast<uint32_t>(p.method);
  sb.req.budget = p.budget;
  sb.req.n_sink = p.n_sink;
  sb.req.n_local = p.n_local;
  sb.req.sparsity = p.sparsity;
  sb.req.heavy_fraction = p.heavy_fraction;
  sb.req.group_size = g;
  sb.req.grouped = grouped;
  sb.req.step = p.step;
  std::vector<uint8_t* const*> code_tables(n);
  for (uint32_t i = 0; i < n; ++i) {
    const ssa_session& s = *items[i].session;
    SessionState& st = state(s);
    const StepReservation& r = *st.reservation;
    const StepReservation::Layer& R = *r.layers[layer_index];
    DecodeItem& it = b.items[i];
    it.kv_pages = static_cast<const uint8_t* const*>(R.kv_table.p);
    it.code_pages = static_cast<const uint8_t* const*>(R.code_table.p);
    it.codebooks = static_cast<const float*>(R.books->dev.p);
    it.query_transform = device_query_transform(*R.books);
    it.q = items[i].q;
    it.out = items[i].out;
    // The launches are planned once for the capacity: the longest context, the
    // largest selection any length up to it gives (g k at most, fewer than the
    // candidates: a budget over all of them reads them densely), every draw
    // possible (no fixed heavy rows). The device plans each step within these.
    const DecodePlan at_cap = plan_decode(R.capacity, p);
    it.n_tokens = static_cast<uint32_t>(R.capacity);
    it.sink_end = static_cast<uint32_t>(at_cap.sink_end);
    it.local_begin = static_cast<uint32_t>(at_cap.local_begin);
    const uint64_t most = (grouped ? g : 1) * budget_at(R.capacity, p);
    it.n_select = static_cast<uint32_t>(std::min<uint64_t>(most, at_cap.candidates()));
    it.n_heavy = 0;
    if (b.sampling != Sampling::kNone && at_cap.candidates() > kMaxSampledCandidates) {
      return absl::UnimplementedError("CUDA backend: sampling over 2^26 or more candidate tokens in one session");
    }
    StepItem& si = sb.items[i];
    si.length = static_cast<uint32_t*>(r.lengths.p) + layer_index;
    si.guard = st.guard;
    si.generation = r.generation;
    si.capacity = static_cast<uint32_t>(R.capacity);
    si.k = static_cast<const uint8_t*>(items[i].k);
    si.v = static_cast<const uint8_t*>(items[i].v);
    si.kv_pages = static_cast<uint8_t* const*>(R.kv_table.p);
    code_tables[i] = static_cast<uint8_t* const*>(R.code_table.p);
  }
  WorkspacePlan plan;
  SSA_CUDA_RETURN(plan_workspace(&b, sms, &plan), "decode planning");
  // The step's own buffers: the device-planned items, positions and RNG steps.
  const size_t items_bytes = (n * sizeof(DecodeItem) + 255) / 256 * 256;
  const size_t pos_bytes = (n * sizeof(uint32_t) + 255) / 256 * 256;
  void* step_blob = nullptr;
  SSA_CUDA_RETURN(device_malloc_async(&step_blob, items_bytes + pos_bytes + n * sizeof(uint64_t), stream),
                  "cudaMallocAsync of the step plan");
  StepPlanOut out;
  out.items = static_cast<DecodeItem*>(step_blob);
  out.position = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(step_blob) + items_bytes);
  out.step = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(step_blob) + items_bytes + pos_bytes);
  void* blob = nullptr;
  cudaError_t e = device_malloc_async(&blob, plan.total_bytes, stream);
  if (e != cudaSuccess) {
    cudaFreeAsync(step_blob, stream);
    return device_error(e, "cudaMallocAsync of the decode workspace");
  }
  const Workspace ws = bind_workspace(blob, plan);
  const bool read_rows = stats != nullptr && b.proxy != Proxy::kNone;
  if (read_rows) e = cudaMemsetAsync(ws.rows, 0, plan.rows * sizeof(RowState), stream);
  if (e == cudaSuccess) e = launch_step_plan(b, sb, out, stream);
  if (e == cudaSuccess) e = launch_step_rows(b.shape, sb, out.position, stream);
  for (uint32_t i = 0; i < n && e == cudaSuccess; ++i) {
    e = pq_encode_at(index_shape(L, items[i].session->config.proxy), b.items[i].kv_pages, code_tables[i], b.items[i].codebooks, out.position + i,
                     stream);
  }
  b.items_dev = out.items;
  b.step_dev = out.step;
  if (e == cudaSuccess) e = run_decode(b, plan, ws, stream);
  // Tiered sessions: rows per page into the reservation's counts (read back at
  // settle), and with stats the rows read from each tier.
  TierBatch tb{};
  bool any_tiered = false;
  for (uint32_t i = 0; i < n; ++i) {
    const StepReservation::Layer& R = *state(*items[i].session).reservation->layers[layer_index];
    if (!R.tiered) continue;
    any_tiered = true;
    tb.items[i].page_tier = static_cast<const uint8_t*>(R.tier_table.p);
    tb.items[i].page_rows = static_cast<uint32_t*>(R.page_rows.p);
  }
  DeviceMem tier_counts;
  std::vector<unsigned long long> counts;
  if (e == cudaSuccess && any_tiered) {
    e = queue_tier_counts(b, ws, tb, n, stream, &tier_counts, stats != nullptr ? &counts : nullptr);
  }
  std::vector<RowState> rows;
  std::vector<DecodeItem> planned;
  if (e == cudaSuccess && stats != nullptr) {
    if (read_rows) {
      rows.resize(plan.rows);
      e = cudaMemcpyAsync(rows.data(), ws.rows, rows.size() * sizeof(RowState), cudaMemcpyDeviceToHost, stream);
    }
    planned.resize(n);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(planned.data(), out.items, n * sizeof(DecodeItem), cudaMemcpyDeviceToHost, stream);
    }
  }
  cudaFreeAsync(blob, stream);
  cudaFreeAsync(step_blob, stream);
  // The event the host waits on before it commits (settle_steps): in a graph,
  // a node of its own, recorded at every replay.
  for (uint32_t i = 0; i < n && e == cudaSuccess; ++i) {
    cudaEvent_t done = state(*items[i].session).step_done;
    e = capturing ? cudaEventRecordWithFlags(done, stream, cudaEventRecordExternal) : cudaEventRecord(done, stream);
  }
  if (e != cudaSuccess) return device_error(e, "decode step kernels");
  if (stats != nullptr) {
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode step");
    std::vector<DecodePlan> plans;
    std::vector<RowState> kept_rows;
    std::vector<unsigned long long> kept_counts;
    const uint32_t ns = b.sel_heads();
    for (uint32_t i = 0; i < n; ++i) {
      if (item_idle(planned[i])) continue;  // dropped: it did nothing
      plans.push_back(plan_decode(planned[i].n_tokens, p));
      if (read_rows) kept_rows.insert(kept_rows.end(), rows.begin() + size_t{i} * ns, rows.begin() + size_t{i + 1} * ns);
      if (!counts.empty()) kept_counts.insert(kept_counts.end(), counts.begin() + 2 * i, counts.begin() + 2 * i + 2);
    }
    add_set_stats(plans, b, kept_rows, kept_counts, L, p, stats);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::decode_steps(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                                       const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats) const {
  if (p.target_error > 0.0f) {
    return unsupported("decode steps with target_error > 0 are not available: the error target's rounds wait on "
                       "the host between decodes; use ssa_session_append_async and ssa_decode");
  }
  const ssa_session& s0 = *items[0].session;
  if (p.group_selection == SSA_GROUP_MIXTURE && s0.layout.group_size() > 1) {
    return unsupported("decode steps with SSA_GROUP_MIXTURE are not available (SSA_GROUP_MEAN_QUERY is)");
  }
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(stream, &cap), "cudaStreamIsCapturing");
  const bool capturing = cap != cudaStreamCaptureStatusNone;
  // A first use may set a kernel's shared-memory limit (ensure_dynamic_smem):
  // not a stream operation, and it must not end the caller's capture.
  RelaxedCapture relaxed;
  if (capturing && stats != nullptr) {
    return invalid_argument("stats of a decode step need a wait for the stream, which is being captured into a "
                            "CUDA graph: pass stats NULL");
  }
  for (size_t i = 0; i < n_items; ++i) {
    const ssa_session& s = *items[i].session;
    if (memcmp(&s.layout, &s0.layout, sizeof(KvLayout)) != 0 || state(s).device != state(s0).device) {
      return invalid_argument("item ", i, ": the sessions of one decode step must share one shape and device");
    }
    const StepReservation::Layer& R = *state(s).reservation->layers[layer];
    if (s.layers[layer].n_tokens >= R.capacity) {
      return invalid_argument("item ", i, ": layer ", layer, " holds ", s.layers[layer].n_tokens,
                              " tokens, its reserved capacity: reserve more (ssa_session_reserve) first");
    }
  }
  SSA_CUDA_RETURN(cudaSetDevice(state(s0).device), "cudaSetDevice");
  int sms = 0;
  SSA_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state(s0).device),
                  "cudaDeviceGetAttribute");
  for (size_t i = 0; i < n_items; i += kMaxBatchItems) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(kMaxBatchItems, n_items - i));
    SSA_RETURN_IF_ERROR(queue_step_set(items + i, n, layer, p, seed, sms, capturing, stats));
  }
  return absl::OkStatus();
}

}  // namespace ssa::cuda
