// The one interface between the core (session store, decode entry points,
// snapshots, the C API) and a backend. The core owns what every backend shares:
// argument and size checks, the session lock, the page lists of each layer and
// their all-or-nothing commit, on-demand index training, snapshot files. A
// backend owns where pages live and how rows are copied, encoded, trained and
// decoded. The CPU backend (lib/cpu/cpu_backend.cc) and the CUDA backend
// (lib/cuda/cuda_backend.cc; lib/cuda/stub.cc in builds without CUDA) implement
// it; nothing outside them asks which backend a session has.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ssa.h"
#include "store/layer_store.h"
#include "store/page.h"

struct ssa_session;

namespace ssa {

struct LayerTail;      // lib/store/layer_tail.h
struct HeadTrace;      // lib/decode/cpu_decode.h
struct DecodeProfile;  // lib/decode/cpu_decode.h

// A backend's own state of one session (device tables, streams, events), held by
// the session; backends that keep none leave it null.
struct BackendSession {
  virtual ~BackendSession() = default;
};

// The rows one append writes, after the core has checked every size (and
// scanned host rows for NaN/Inf).
struct AppendRows {
  uint32_t layer = 0;
  const void* k = nullptr;  // token-major [new_n - old_n][n_kv_heads][head_dim],
  const void* v = nullptr;  // in the session's memory space
  uint64_t old_n = 0, new_n = 0;  // the layer's tokens [old_n, new_n) are written
  bool encode = false;  // write their PQ codes with the layer's codebooks
  bool trains = false;  // the layer is retrained next: the rows must be complete on return
  bool async = false;   // ssa_session_append_async with device rows: queue on `stream`, wait for nothing
  void* stream = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- runtime and session lifetime
  // OK when `device` can serve sessions of this backend.
  virtual absl::Status check_device(int device) const = 0;
  // OK when a runtime may shard its sessions over `devices` (two or more, in
  // shard order), after anything the backend sets up for that (peer access).
  virtual absl::Status prepare_shard_devices(const std::vector<int32_t>& devices) const = 0;
  // Page-locks `bytes` of host memory (ssa_runtime_options.host_pool_bytes, a
  // valid nonzero value) for the host tier of rt's sessions. Backends without
  // a host tier ignore it.
  virtual absl::Status reserve_host_pool(ssa_runtime& rt, uint64_t bytes) const { return absl::OkStatus(); }
  // Sets up what rt's sessions share under a limited device budget (rt.budget is
  // set and limited). Backends without a device budget ignore it.
  virtual absl::Status init_budget(ssa_runtime& rt) const { return absl::OkStatus(); }
  // Sets up the backend state of a new or loaded session (s.layout is set).
  virtual absl::Status init_session(ssa_session& s) const = 0;
  // The backend state of a fork of `from` (shares pools, caches nothing).
  virtual absl::Status init_fork(const ssa_session& from, ssa_session& fork) const = 0;
  // After a session on `device` was destroyed.
  virtual void session_destroyed(int device) const = 0;

  // ---- memory space of K, V, q and out
  // True when they are device memory unless the session takes host pointers
  // (SSA_SESSION_HOST_POINTERS); the rule itself is host_buffers() below.
  virtual bool device_buffers() const = 0;
  // OK when `p` is in the session's memory space, as far as the backend can tell.
  virtual absl::Status check_buffer(const ssa_session& s, const void* p, const char* name) const = 0;
  // Copies `bytes` bytes at `p` (in the session's memory space, passed by
  // check_buffer) into host memory `out`, complete on return (queries a layer is
  // shown, ssa_session_observe_queries).
  virtual absl::Status copy_to_host(const ssa_session& s, const void* p, size_t bytes, void* out) const {
    memcpy(out, p, bytes);
    return absl::OkStatus();
  }

  // ---- append (the skeleton: lib/session.cc)
  // Before the session lock: checks of the stream of an asynchronous append, and
  // for rows the core scans on the host, the wait until the stream wrote them.
  virtual absl::Status prepare_append(const ssa_session& s, bool async, void* stream) const = 0;
  // The pages the append writes (lib/store/layer_tail.h), from the backend's pools.
  virtual absl::Status gather_tail(ssa_session& s, LayerStore& layer, uint64_t new_n, bool codes,
                                   LayerTail* tail) const = 0;
  // Copies the rows into the tail's pages and encodes them (rows.encode);
  // device rows are scanned for NaN/Inf here, unless queued asynchronously.
  virtual absl::Status write_rows(ssa_session& s, const AppendRows& rows, const LayerStore& layer,
                                  LayerTail& tail) const = 0;
  // Trains codebooks on `layer` and re-encodes all its codes; changes `layer`
  // only when everything succeeded.
  virtual absl::Status train_index(ssa_session& s, LayerStore& layer) const = 0;
  // Before a truncation to n_tokens (session held exclusively).
  virtual absl::Status before_truncate(ssa_session& s, uint64_t n_tokens) const = 0;

  // ---- decode (lib/decode/decode.cc)
  // Refuses a decode of layer `layer` of `s` the backend cannot serve (the
  // parameters, the stream, the layer's pages), before anything lazy is done
  // for it (an index trained on demand). The caller holds no lock of s.
  virtual absl::Status check_decode(const ssa_session& s, uint32_t layer, const ssa_decode_params& p) const = 0;
  // One layer, reader lock held, index present when the method needs one.
  // stats accumulates; traces and profile are filled where the backend records them.
  virtual absl::Status decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                                    const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                                    ssa_decode_stats* stats, std::vector<HeadTrace>* traces,
                                    DecodeProfile* profile) const = 0;
  // True when decode_layer fills `traces` (the rows each query head read), which
  // ssa_decode_traced needs.
  virtual bool records_traces() const = 0;
  // Validated items of sessions of one runtime of this backend.
  virtual absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                                    const ssa_decode_params& p) const = 0;

  // ---- decode steps (lib/decode/decode_step.cc; the CUDA backend's graph_step.h).
  // The defaults are a backend without graphs: nothing to reserve, and every
  // step runs eagerly as an append then a decode (the core's composite).
  // Refuses sessions a reservation cannot serve (before anything is trained).
  virtual absl::Status check_reservable(const ssa_session& s) const { return absl::OkStatus(); }
  // A reservation of n_tokens more tokens on every layer (session held
  // exclusively; every layer holds tokens and an index; none held before).
  virtual absl::Status reserve_steps(ssa_session& s, uint64_t n_tokens) const { return absl::OkStatus(); }
  // A turn started ahead of a reservation of n_tokens (ssa_session_prefetch;
  // session held exclusively, check_reservable passed): nothing where nothing
  // is on another tier.
  virtual absl::Status prefetch_turn(ssa_session& s, uint64_t n_tokens) const { return absl::OkStatus(); }
  // Whether s has a reservation (read without the lock).
  virtual bool has_steps(const ssa_session& s) const { return false; }
  // Waits for the session's queued steps and commits the tokens they appended
  // to its layers; with `end`, also ends the reservation (its unused pages are
  // freed, replays of steps queued under it do nothing). dropped: null keeps
  // the count of steps that did nothing (a replay after the reservation ended,
  // or at its capacity); else receives it (since the last report) and resets
  // it. Session held exclusively.
  virtual absl::Status settle_steps(ssa_session& s, bool end, uint64_t* dropped) const { return absl::OkStatus(); }
  // One step of every item (sessions with a reservation; shared locks held).
  virtual absl::Status decode_steps(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                                    const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats) const {
    return absl::UnimplementedError("this backend has no decode-step reservations");
  }
  // Refuses a step of sessions without a reservation that cannot run eagerly
  // (a stream being captured into a CUDA graph).
  virtual absl::Status check_eager_step(const ssa_decode_params& p) const { return absl::OkStatus(); }

  // ---- caller's buffers
  // Copies bytes of the caller's buffer p (in the session's memory space; the
  // caller's `stream` may still be writing device memory) to host memory.
  virtual absl::Status read_caller_buffer(const ssa_session& s, const void* p, size_t bytes, void* stream,
                                          void* host) const {
    memcpy(host, p, bytes);
    return absl::OkStatus();
  }

  // ---- snapshot staging (lib/snapshot): files hold the same bytes for every backend
  // A new KV (kv) or code page of `bytes` bytes, page `page_index` of its layer
  // (a sharded session places it on its shard's device), written by `fill`
  // through host memory: the page itself, or host staging (from `staging`) then
  // uploaded.
  virtual absl::StatusOr<PageRef> page_from_host(const ssa_session& s, bool kv, uint64_t page_index, size_t bytes,
                                                 absl::FunctionRef<uint8_t*()> staging,
                                                 absl::FunctionRef<absl::Status(uint8_t*)> fill) const = 0;
  // The first `bytes` bytes of `page` in host memory: the page itself, or a copy
  // in host staging (from `staging`, as large as the largest page).
  virtual absl::StatusOr<const uint8_t*> page_to_host(const ssa_session& s, const Page& page, size_t bytes,
                                                      absl::FunctionRef<uint8_t*()> staging) const = 0;
};

const Backend& cpu_backend();
// Null in a build without the CUDA backend.
const Backend* cuda_backend();
// The backend of a runtime of `kind` (AUTO resolved); null when this build lacks it.
const Backend* backend_of(ssa_backend kind);
// The backend a new runtime gets: CPU; CUDA when asked for (and usable); AUTO:
// CUDA when this build has it and `device` exists, else CPU.
absl::StatusOr<ssa_backend> choose_backend(ssa_backend wanted, int device);

// The host-pointer rule: K, V, q and out of session `s` are host memory (the
// core may read them: size checks first, then NaN/Inf scans).
bool host_buffers(const ssa_session& s);

}  // namespace ssa
