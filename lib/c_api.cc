// The ABI boundary: argument checks, a catch-all around every call, the mapping
// from internal absl::Status to ssa_status, and the thread-local error message.
#include <stdio.h>

#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "backend.h"
#include "decode/decode.h"
#include "decode/decode_buffers.h"
#include "decode/decode_plan.h"
#include "decode/decode_step.h"
#include "decode/decode_traced.h"
#include "runtime.h"
#include "session.h"
#include "shard/callback_collective.h"
#include "shard/communicator_group.h"
#include "shard/group_margin.h"
#include "shard/shard_map.h"
#include "shard/shard_options.h"
#include "snapshot/snapshot.h"
#include "ssa.h"
#include "status.h"
#include "store/host_pool_option.h"
#include "versioned_struct.h"

namespace {

thread_local std::string g_last_error;
// Set instead of g_last_error when copying a message failed for lack of memory.
thread_local const char* g_static_error = nullptr;

// Never throws: it runs inside the catch handlers of guarded(), where an
// exception (a message copy failing when memory is exhausted) would escape
// the ABI.
ssa_status fail(ssa_status code, absl::string_view message) noexcept {
  try {
    g_last_error.assign(message.data(), message.size());
    g_static_error = nullptr;
  } catch (...) {
    g_static_error = "out of host memory (the error message could not be stored)";
  }
  return code;
}

ssa_status report(const absl::Status& st) {
  if (st.ok()) {
    g_last_error.clear();
    g_static_error = nullptr;
    return SSA_OK;
  }
  return fail(ssa::status_code(st), st.message());
}

// Runs fn (returning absl::Status) so that nothing thrown escapes the ABI.
template <typename Fn>
ssa_status guarded(Fn&& fn) {
  try {
    return report(fn());
  } catch (const std::bad_alloc&) {
    return fail(SSA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    char message[512];  // on the stack: no allocation inside the handler
    snprintf(message, sizeof message, "internal error: %s", e.what());
    return fail(SSA_ERR_INTERNAL, message);
  } catch (...) {
    return fail(SSA_ERR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace

extern "C" {

uint32_t ssa_version(void) {
  return SSA_VERSION_MAJOR * 10000u + SSA_VERSION_MINOR * 100u + SSA_VERSION_PATCH;
}

#define SSA_STR2(x) #x
#define SSA_STR(x) SSA_STR2(x)
const char* ssa_version_string(void) {
  return SSA_STR(SSA_VERSION_MAJOR) "." SSA_STR(SSA_VERSION_MINOR) "." SSA_STR(SSA_VERSION_PATCH);
}

const char* ssa_status_string(ssa_status st) {
  switch (ssa::enum_value(st)) {
    case SSA_OK: return "SSA_OK";
    case SSA_ERR_INVALID_ARGUMENT: return "SSA_ERR_INVALID_ARGUMENT";
    case SSA_ERR_OUT_OF_MEMORY: return "SSA_ERR_OUT_OF_MEMORY";
    case SSA_ERR_IO: return "SSA_ERR_IO";
    case SSA_ERR_CORRUPT: return "SSA_ERR_CORRUPT";
    case SSA_ERR_VERSION: return "SSA_ERR_VERSION";
    case SSA_ERR_MISMATCH: return "SSA_ERR_MISMATCH";
    case SSA_ERR_UNSUPPORTED: return "SSA_ERR_UNSUPPORTED";
    case SSA_ERR_DEVICE: return "SSA_ERR_DEVICE";
    case SSA_ERR_BUSY: return "SSA_ERR_BUSY";
    case SSA_ERR_INTERNAL: return "SSA_ERR_INTERNAL";
    default: return "SSA_ERR_UNKNOWN";
  }
}

const char* ssa_last_error_message(void) {
  return g_static_error != nullptr ? g_static_error : g_last_error.c_str();
}

/* ---- runtime ---- */

void ssa_runtime_options_init(ssa_runtime_options* o) {
  if (o == nullptr) return;
  *o = ssa_runtime_options{};
  o->struct_size = sizeof(ssa_runtime_options);
  o->backend = SSA_BACKEND_AUTO;
  o->device = 0;
  o->num_threads = 0;
  o->seed = 0x5EED;
}

ssa_status ssa_runtime_create(const ssa_runtime_options* opts, ssa_runtime** out) {
  return guarded([&]() -> absl::Status {
    if (out == nullptr) return ssa::invalid_argument("out is NULL");
    ssa_runtime_options o;
    ssa_runtime_options_init(&o);
    if (opts != nullptr) SSA_RETURN_IF_ERROR(ssa::read_struct(opts, &o));
    if (ssa::enum_value(o.backend) > SSA_BACKEND_CUDA) {
      return ssa::invalid_argument("unknown backend ", ssa::enum_value(o.backend),
                                   " (SSA_BACKEND_AUTO, _CPU or _CUDA)");
    }
    if (o.num_threads < 0 || o.num_threads > 4096) {
      return ssa::invalid_argument("num_threads ", o.num_threads, " must be in 0..4096");
    }
    if (o.host_cache_bytes > o.device_kv_budget) {
      return ssa::invalid_argument("host_cache_bytes ", o.host_cache_bytes, " exceeds device_kv_budget ",
                                   o.device_kv_budget, " (the cache is part of the budget; 0 = an eighth of it)");
    }
    SSA_RETURN_IF_ERROR(ssa::check_host_pool_option(o));
    std::vector<int32_t> devices;
    SSA_RETURN_IF_ERROR(ssa::read_shard_devices(o, &devices));
    absl::StatusOr<uint64_t> shard_tokens = ssa::resolve_shard_tokens(o.shard_tokens);
    if (!shard_tokens.ok()) return shard_tokens.status();
    std::shared_ptr<ssa::ProcessGroup> group;
    if (o.communicator != nullptr && o.collective != nullptr) {
      return ssa::invalid_argument("ssa_runtime_options: communicator and collective are both set; a runtime is "
                                   "one rank of one group: pass one of them");
    }
    if (o.collective != nullptr) {
      absl::StatusOr<std::shared_ptr<ssa::ProcessGroup>> g = ssa::ProcessGroup::create(o.collective);
      if (!g.ok()) return g.status();
      group = *std::move(g);
      SSA_RETURN_IF_ERROR(ssa::check_group_backend(o, devices));
      // AUTO: a table of host callbacks makes a CPU rank; CUDA ranks ask for CUDA.
      if (o.backend == SSA_BACKEND_AUTO) o.backend = SSA_BACKEND_CPU;
    }
    if (o.communicator != nullptr) {
      if (!ssa::kHaveCommunicators) return ssa::unsupported(ssa::kCommunicatorUnsupported);
      if (o.backend == SSA_BACKEND_CPU) {
        return ssa::invalid_argument("ssa_runtime_options.communicator (an ncclComm_t) with SSA_BACKEND_CPU: a "
                                     "CPU rank of a group takes a `collective` table");
      }
      o.backend = SSA_BACKEND_CUDA;
      SSA_RETURN_IF_ERROR(ssa::check_group_backend(o, devices));
    }
    // Refused before any device is looked at: the answer does not depend on the machine.
    if (o.backend == SSA_BACKEND_CUDA && devices.size() > 1 && o.device_kv_budget != 0) {
      return ssa::unsupported(ssa::kShardedBudgetUnsupported);
    }
    absl::StatusOr<ssa_backend> chosen = ssa::choose_backend(o.backend, devices[0]);
    if (!chosen.ok()) return chosen.status();
    if (o.communicator != nullptr) {
      absl::StatusOr<std::shared_ptr<ssa::ProcessGroup>> g = ssa::communicator_group(o.communicator, devices[0]);
      if (!g.ok()) return g.status();
      group = *std::move(g);
    }
    if (*chosen == SSA_BACKEND_CUDA && devices.size() > 1) {
      if (o.device_kv_budget != 0) return ssa::unsupported(ssa::kShardedBudgetUnsupported);
      SSA_RETURN_IF_ERROR(ssa::backend_of(SSA_BACKEND_CUDA)->prepare_shard_devices(devices));
    }
    int threads = o.num_threads;
    if (threads == 0) {
      threads = static_cast<int>(std::thread::hardware_concurrency());
      if (threads <= 0) threads = 1;
    }
    auto rt = std::make_unique<ssa_runtime>();
    rt->backend = *chosen;
    rt->device = devices[0];
    rt->devices = std::move(devices);
    rt->shard_tokens = *shard_tokens;
    rt->seed = o.seed;
    rt->pool = std::make_unique<ssa::ThreadPool>(threads);
    rt->decode_buffers = std::make_shared<ssa::DecodeBufferPool>();
    const uint64_t cache = o.host_cache_bytes != 0 ? o.host_cache_bytes : o.device_kv_budget / 8;
    rt->budget = std::make_shared<ssa::DeviceBudget>(o.device_kv_budget, cache);
    if (o.device_kv_budget != 0) {
      rt->budget_peers = std::make_shared<ssa::BudgetPeers>();
      SSA_RETURN_IF_ERROR(ssa::backend_of(rt->backend)->init_budget(*rt));
    }
    if (o.host_pool_bytes != 0) {
      SSA_RETURN_IF_ERROR(ssa::backend_of(rt->backend)->reserve_host_pool(*rt, o.host_pool_bytes));
    }
    if (group != nullptr) {
      SSA_RETURN_IF_ERROR(ssa::check_group_agreement(*group, rt->shard_tokens, rt->backend));
      rt->own = ssa::held_tokens(group->rank(), group->size(), rt->shard_tokens);
      rt->held = rt->backend == SSA_BACKEND_CUDA ? ssa::held_with_margin(group->rank(), group->size(), rt->shard_tokens)
                                                 : rt->own;
      rt->group = std::move(group);
    }
    *out = rt.release();
    return absl::OkStatus();
  });
}

void ssa_runtime_destroy(ssa_runtime* rt) { delete rt; }

ssa_backend ssa_runtime_backend(const ssa_runtime* rt) {
  return rt == nullptr ? SSA_BACKEND_AUTO : rt->backend;
}

int32_t ssa_runtime_num_threads(const ssa_runtime* rt) {
  return rt == nullptr ? 0 : rt->pool->num_threads();
}

uint32_t ssa_runtime_num_shards(const ssa_runtime* rt) {
  if (rt == nullptr) return 0;
  return rt->group != nullptr ? rt->group->size() : static_cast<uint32_t>(rt->devices.size());
}

uint32_t ssa_runtime_rank(const ssa_runtime* rt) {
  return rt == nullptr || rt->group == nullptr ? 0 : rt->group->rank();
}

void ssa_collective_init(ssa_collective* c) {
  if (c == nullptr) return;
  *c = ssa_collective{};
  c->struct_size = sizeof(ssa_collective);
  c->rank = 0;
  c->size = 1;
  c->timeout_ms = 60000;
}

/* ---- sessions ---- */

void ssa_session_config_init(ssa_session_config* c) {
  if (c == nullptr) return;
  *c = ssa_session_config{};
  c->struct_size = sizeof(ssa_session_config);
  c->kv_dtype = SSA_DTYPE_F16;
  c->pq_subspaces = 16;
  c->pq_centroids = 256;
  c->model_fingerprint = 0;
  c->page_tokens = 256;
  c->flags = 0;
  c->index_min_tokens = 2048;
  c->index_regrow_factor = 4.0f;
  c->index_train_sample = 16384;
  c->index_iterations = 8;
  c->proxy = SSA_PROXY_PQ;
  c->pq_parallel_weight = 1.0f;
}

ssa_status ssa_session_create(ssa_runtime* rt, const ssa_session_config* cfg, ssa_session** out) {
  return guarded([&]() -> absl::Status {
    if (rt == nullptr || cfg == nullptr || out == nullptr) {
      return ssa::invalid_argument("rt, cfg and out must not be NULL");
    }
    ssa_session_config c;
    ssa_session_config_init(&c);
    SSA_RETURN_IF_ERROR(ssa::read_struct(cfg, &c));
    auto s = ssa::create_session(rt, c);
    if (!s.ok()) return s.status();
    *out = s->release();
    return absl::OkStatus();
  });
}

void ssa_session_destroy(ssa_session* s) { ssa::session_destroy(s); }

uint64_t ssa_session_length(const ssa_session* s) {
  if (s == nullptr) return 0;
  std::shared_lock lock(s->mu);
  return ssa::session_length_locked(*s);
}

uint64_t ssa_session_layer_length(const ssa_session* s, uint32_t layer) {
  if (s == nullptr) return 0;
  std::shared_lock lock(s->mu);
  return layer < s->layers.size() ? s->layers[layer].n_tokens : 0;
}

ssa_status ssa_session_get_config(const ssa_session* s, ssa_session_config* cfg) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr || cfg == nullptr) return ssa::invalid_argument("s and cfg must not be NULL");
    SSA_RETURN_IF_ERROR(ssa::check_output_struct(cfg));
    ssa::write_struct(s->config, cfg);
    return absl::OkStatus();
  });
}

ssa_status ssa_session_append(ssa_session* s, uint32_t layer, const void* k, const void* v,
                              uint64_t n_tokens) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_append(*s, layer, k, v, n_tokens);
  });
}

ssa_status ssa_session_append_async(ssa_session* s, uint32_t layer, const void* k, const void* v,
                                    uint64_t n_tokens, void* stream) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_append_async(*s, layer, k, v, n_tokens, stream);
  });
}

ssa_status ssa_session_update_index(ssa_session* s) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_update_index(*s);
  });
}

ssa_status ssa_session_observe_queries(ssa_session* s, uint32_t layer, const void* q, uint64_t n) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_observe_queries(*s, layer, q, n);
  });
}

ssa_status ssa_session_truncate(ssa_session* s, uint64_t n_tokens) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_truncate(*s, n_tokens);
  });
}

ssa_status ssa_session_fork(ssa_session* s, ssa_session** out) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr || out == nullptr) return ssa::invalid_argument("s and out must not be NULL");
    auto f = ssa::session_fork(*s);
    if (!f.ok()) return f.status();
    *out = f->release();
    return absl::OkStatus();
  });
}

/* ---- decode ---- */

void ssa_decode_params_init(ssa_decode_params* p) {
  if (p == nullptr) return;
  *p = ssa_decode_params{};
  p->struct_size = sizeof(ssa_decode_params);
  p->method = SSA_METHOD_SSA;
  p->budget = 0;
  p->sparsity = 50.0f;
  p->heavy_fraction = 0.4f;
  p->n_sink = 128;
  p->n_local = 128;
  p->pi_min = 1e-4f;
  p->seed = 0;
  p->step = 0;
  p->stream = nullptr;
  p->target_error = 0.0f;
  p->target_delta = 0.1f;
  p->max_budget = 0;
}

void ssa_decode_stats_init(ssa_decode_stats* st) {
  if (st == nullptr) return;
  *st = ssa_decode_stats{};
  st->struct_size = sizeof(ssa_decode_stats);
}

ssa_status ssa_decode(ssa_session* s, uint32_t layer, const void* q, void* out,
                      const ssa_decode_params* p, ssa_decode_stats* stats) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    ssa_decode_params params;
    SSA_RETURN_IF_ERROR(ssa::read_decode_params(p, &params));
    return ssa::decode(*s, layer, q, out, params, stats);
  });
}

ssa_status ssa_decode_traced(ssa_session* s, uint32_t layer, const void* q, void* out,
                             const ssa_decode_params* p, ssa_decode_stats* stats, uint32_t* tokens,
                             float* log_pi, uint64_t capacity, uint64_t* head_offsets) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    ssa_decode_params params;
    SSA_RETURN_IF_ERROR(ssa::read_decode_params(p, &params));
    ssa::TraceBuffers buf;
    buf.tokens = tokens;
    buf.log_pi = log_pi;
    buf.capacity = capacity;
    buf.head_offsets = head_offsets;
    return ssa::decode_traced(*s, layer, q, out, params, stats, buf);
  });
}

ssa_status ssa_decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                            const ssa_decode_params* p) {
  return guarded([&]() -> absl::Status {
    ssa_decode_params params;
    SSA_RETURN_IF_ERROR(ssa::read_decode_params(p, &params));
    return ssa::decode_batch(items, n_items, layer, params);
  });
}

/* ---- decode steps (lib/decode/decode_step.cc) ---- */

ssa_status ssa_decode_step(ssa_session* s, uint32_t layer, const void* k, const void* v, const void* q,
                           void* out, const ssa_decode_params* p, ssa_decode_stats* stats) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    ssa_decode_params params;
    SSA_RETURN_IF_ERROR(ssa::read_decode_params(p, &params));
    const ssa_decode_step_item item{s, k, v, q, out};
    return ssa::decode_step(&item, 1, layer, params, stats);
  });
}

ssa_status ssa_decode_step_batch(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                                 const ssa_decode_params* p, ssa_decode_stats* stats) {
  return guarded([&]() -> absl::Status {
    ssa_decode_params params;
    SSA_RETURN_IF_ERROR(ssa::read_decode_params(p, &params));
    return ssa::decode_step(items, n_items, layer, params, stats);
  });
}

ssa_status ssa_session_reserve(ssa_session* s, uint64_t n_tokens) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_reserve(*s, n_tokens);
  });
}

ssa_status ssa_session_prefetch(ssa_session* s, uint64_t n_tokens) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_prefetch(*s, n_tokens);
  });
}

ssa_status ssa_session_sync(ssa_session* s, uint64_t* dropped_steps) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_sync(*s, dropped_steps);
  });
}

/* ---- snapshots (lib/snapshot) ---- */

ssa_status ssa_session_save(ssa_session* s, const char* path) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::snapshot_save(*s, path);
  });
}

ssa_status ssa_session_checkpoint(ssa_session* s, const char* path) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::snapshot_checkpoint(*s, path);
  });
}

ssa_status ssa_session_load(ssa_runtime* rt, const char* path, uint32_t flags, ssa_session** out) {
  return guarded([&]() -> absl::Status {
    if (out == nullptr) return ssa::invalid_argument("out is NULL");
    absl::StatusOr<std::unique_ptr<ssa_session>> s = ssa::snapshot_load(rt, path, flags);
    if (!s.ok()) return s.status();
    *out = s->release();
    return absl::OkStatus();
  });
}

ssa_status ssa_session_load_checked(ssa_runtime* rt, const char* path, uint32_t flags,
                                    const ssa_session_config* expected, ssa_session** out) {
  return guarded([&]() -> absl::Status {
    if (out == nullptr) return ssa::invalid_argument("out is NULL");
    ssa_session_config want;
    if (expected != nullptr) {
      ssa_session_config_init(&want);
      SSA_RETURN_IF_ERROR(ssa::read_struct(expected, &want));
      if (ssa::enum_value(want.kv_dtype) > SSA_DTYPE_BF16) {
        return ssa::invalid_argument("unknown expected kv_dtype ", ssa::enum_value(want.kv_dtype),
                                     " (SSA_DTYPE_F32, _F16 or _BF16)");
      }
    }
    absl::StatusOr<std::unique_ptr<ssa_session>> s =
        ssa::snapshot_load_checked(rt, path, flags, expected != nullptr ? &want : nullptr);
    if (!s.ok()) return s.status();
    *out = s->release();
    return absl::OkStatus();
  });
}

void ssa_snapshot_info_init(ssa_snapshot_info* info) {
  if (info == nullptr) return;
  *info = ssa_snapshot_info{};
  info->struct_size = sizeof(ssa_snapshot_info);
}

ssa_status ssa_snapshot_inspect(const char* path, ssa_snapshot_info* info) {
  return guarded([&]() { return ssa::snapshot_inspect(path, info); });
}

ssa_status ssa_session_set_metadata(ssa_session* s, const void* bytes, size_t n) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_set_metadata(*s, bytes, n);
  });
}

ssa_status ssa_session_get_metadata(const ssa_session* s, void* buf, size_t cap, size_t* n_out) {
  return guarded([&]() -> absl::Status {
    if (s == nullptr) return ssa::invalid_argument("session is NULL");
    return ssa::session_get_metadata(*s, buf, cap, n_out);
  });
}

}  // extern "C"
