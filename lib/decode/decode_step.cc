#include "decode_step.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "backend.h"
#include "caller_buffers.h"
#include "decode.h"
#include "decode_plan.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {
namespace {

// dropped: null keeps the count of dropped steps for ssa_session_sync.
absl::Status settle(ssa_session& s, bool end, uint64_t* dropped) {
  return s.backend->settle_steps(s, end, dropped);
}

uint64_t layer_length(const ssa_session& s, uint32_t layer) {
  std::shared_lock lock(s.mu);
  return s.layers[layer].n_tokens;
}

void add_stats(const ssa_decode_stats& a, ssa_decode_stats* t) {
  t->context_tokens += a.context_tokens;
  t->tokens_read += a.tokens_read;
  t->heavy_tokens += a.heavy_tokens;
  t->draws += a.draws;
  t->unique_samples += a.unique_samples;
  t->residual_proxy_mass += a.residual_proxy_mass;
  t->scored_tokens += a.scored_tokens;
  t->target_budget += a.target_budget;
  t->capped_heads += a.capped_heads;
  t->predicted_error += a.predicted_error;
  t->window_only_heads += a.window_only_heads;
  t->rows_from_host += a.rows_from_host;
  t->host_cache_hits += a.host_cache_hits;
}

// The buffers of one step item under the aliasing rule (ssa.h, Conventions):
// out may overlap none of k, v, q (nor another item's buffers).
void add_step_buffers(const ssa_decode_step_item& it, size_t item, std::vector<CallerBuffer>* out) {
  const ssa_session& s = *it.session;
  const size_t kv_bytes = size_t{s.layout.n_kv_heads} * s.layout.row_bytes();
  out->push_back(CallerBuffer{it.k, kv_bytes, "k", false, item});
  out->push_back(CallerBuffer{it.v, kv_bytes, "v", false, item});
  out->push_back(q_buffer(s, it.q, item));
  out->push_back(out_buffer(s, it.out, item));
}

absl::Status check_step_item(const ssa_decode_step_item& it, uint32_t layer) {
  if (it.session == nullptr) return invalid_argument("session is NULL");
  const ssa_session& s = *it.session;
  if (it.k == nullptr || it.v == nullptr || it.q == nullptr || it.out == nullptr) {
    return invalid_argument("k, v, q and out must not be NULL");
  }
  if (layer >= s.layout.n_layers) return invalid_argument("layer ", layer, " >= n_layers ", s.layout.n_layers);
  std::vector<CallerBuffer> buffers;
  add_step_buffers(it, SIZE_MAX, &buffers);
  SSA_RETURN_IF_ERROR(check_no_overlap(std::move(buffers)));
  SSA_RETURN_IF_ERROR(s.backend->check_buffer(s, it.k, "k"));
  SSA_RETURN_IF_ERROR(s.backend->check_buffer(s, it.v, "v"));
  SSA_RETURN_IF_ERROR(s.backend->check_buffer(s, it.q, "q"));
  return s.backend->check_buffer(s, it.out, "out");
}

// The composite every backend can run: the token appended (as
// ssa_session_append_async on p.stream), then the layer decoded with the RNG
// step p.step + the token's position, the step a reservation's device plan uses.
absl::Status eager_step(const ssa_decode_step_item& it, uint32_t layer, const ssa_decode_params& p,
                        ssa_decode_stats* stats) {
  ssa_session& s = *it.session;
  const uint64_t position = layer_length(s, layer);
  SSA_RETURN_IF_ERROR(session_append_async(s, layer, it.k, it.v, 1, p.stream));
  ssa_decode_params q = p;
  q.step = p.step + position;
  return decode(s, layer, it.q, it.out, q, stats);
}

}  // namespace

absl::Status session_settle_locked(ssa_session& s, bool end) {
  if (!s.backend->has_steps(s)) return absl::OkStatus();
  return settle(s, end, nullptr);
}

absl::Status session_settle(ssa_session& s, bool end) {
  if (!s.backend->has_steps(s)) return absl::OkStatus();
  std::unique_lock lock(s.mu);
  return settle(s, end, nullptr);
}

absl::Status session_reserve(ssa_session& s, uint64_t n_tokens) {
  if (n_tokens == 0) return invalid_argument("n_tokens must be at least 1");
  if (n_tokens > kMaxTokensPerLayer) {
    return invalid_argument("n_tokens ", n_tokens, " exceeds the limit of ", kMaxTokensPerLayer, " tokens per layer");
  }
  {
    std::shared_lock lock(s.mu);
    SSA_RETURN_IF_ERROR(s.backend->check_reservable(s));
  }
  // Every layer decodes with an index during the reservation (its codes are
  // written in the step): one missing is trained now, as a decode would.
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    bool empty = false, missing = false;
    {
      std::shared_lock lock(s.mu);
      empty = s.layers[l].n_tokens == 0;
      missing = s.layers[l].codebooks == nullptr;
    }
    if (empty && !s.backend->has_steps(s)) {
      return invalid_argument("layer ", l, " holds no tokens: append the prompt before reserving");
    }
    if (missing && !empty && s.backend->device_buffers()) SSA_RETURN_IF_ERROR(session_ensure_index(s, l));
  }
  std::unique_lock lock(s.mu);
  SSA_RETURN_IF_ERROR(settle(s, true, nullptr));
  for (uint32_t l = 0; l < s.layout.n_layers; ++l) {
    const LayerStore& layer = s.layers[l];
    if (layer.n_tokens == 0) {
      return invalid_argument("layer ", l, " holds no tokens: append the prompt before reserving");
    }
    if (n_tokens > kMaxTokensPerLayer - layer.n_tokens) {
      return invalid_argument("reserving ", n_tokens, " tokens on layer ", l, " of ", layer.n_tokens,
                              " exceeds the limit of ", kMaxTokensPerLayer, " tokens per layer");
    }
  }
  return s.backend->reserve_steps(s, n_tokens);
}

absl::Status session_prefetch(ssa_session& s, uint64_t n_tokens) {
  if (n_tokens > kMaxTokensPerLayer) {
    return invalid_argument("n_tokens ", n_tokens, " exceeds the limit of ", kMaxTokensPerLayer, " tokens per layer");
  }
  std::unique_lock lock(s.mu);
  SSA_RETURN_IF_ERROR(s.backend->check_reservable(s));
  return s.backend->prefetch_turn(s, n_tokens);
}

absl::Status session_sync(ssa_session& s, uint64_t* dropped_steps) {
  uint64_t dropped = 0;
  {
    std::unique_lock lock(s.mu);
    SSA_RETURN_IF_ERROR(settle(s, false, &dropped));
  }
  if (dropped_steps != nullptr) *dropped_steps = dropped;
  return absl::OkStatus();
}

absl::Status decode_step(const ssa_decode_step_item* items, size_t n_items, uint32_t layer,
                         const ssa_decode_params& p, ssa_decode_stats* stats) {
  if (n_items == 0) return absl::OkStatus();
  if (items == nullptr) return invalid_argument("items is NULL");
  if (n_items > static_cast<size_t>(PTRDIFF_MAX) / sizeof(ssa_decode_step_item)) {
    return invalid_argument("n_items ", n_items, " is larger than any array of items");
  }
  SSA_RETURN_IF_ERROR(validate_decode_params(p));
  if (stats != nullptr) SSA_RETURN_IF_ERROR(check_output_struct(stats));
  const ssa_runtime* rt = items[0].session != nullptr ? items[0].session->rt : nullptr;
  size_t reserved = 0;
  for (size_t i = 0; i < n_items; ++i) {
    absl::Status st = check_step_item(items[i], layer);
    if (st.ok() && items[i].session->rt != rt) st = invalid_argument("sessions of different runtimes");
    if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
    if (items[i].session->backend->has_steps(*items[i].session)) ++reserved;
  }
  {
    std::vector<CallerBuffer> buffers;
    for (size_t i = 0; i < n_items; ++i) add_step_buffers(items[i], i, &buffers);
    SSA_RETURN_IF_ERROR(check_no_overlap(std::move(buffers)));
  }
  // One token per session and step: a session twice would append twice.
  {
    std::vector<const ssa_session*> seen;
    for (size_t i = 0; i < n_items; ++i) seen.push_back(items[i].session);
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
      return invalid_argument("a session appears in two items of one step (each item appends a token)");
    }
  }
  const Backend& backend = *items[0].session->backend;
  if (p.group_selection != SSA_GROUP_OFF && p.target_error > 0.0f) return unsupported(kGroupNoErrorTarget);
  if (reserved != 0 && reserved != n_items) {
    return invalid_argument("some sessions of the step have a reservation (ssa_session_reserve) and some not: "
                            "reserve all of them or none");
  }
  ssa_decode_stats fresh{};
  if (reserved == 0) {
    SSA_RETURN_IF_ERROR(backend.check_eager_step(p));
    // Every item's decode checked before the first appends (the device path's
    // own refusals are decode_steps').
    for (size_t i = 0; i < n_items; ++i) {
      const absl::Status st = check_decode_request(*items[i].session, layer, p);
      if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
    }
    for (size_t i = 0; i < n_items; ++i) {
      ssa_decode_stats one{};
      one.struct_size = sizeof one;
      const absl::Status st = eager_step(items[i], layer, p, stats != nullptr ? &one : nullptr);
      if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
      if (stats != nullptr) add_stats(one, &fresh);
    }
  } else {
    const uint64_t seed = p.seed != 0 ? p.seed : rt->seed;
    // Shared locks on every session (sorted by address: one global order): a
    // settle (which ends or commits the reservation) waits for the step to be queued.
    std::vector<ssa_session*> sessions;
    for (size_t i = 0; i < n_items; ++i) sessions.push_back(items[i].session);
    std::sort(sessions.begin(), sessions.end());
    std::vector<std::shared_lock<RwLock>> locks;
    locks.reserve(sessions.size());
    for (ssa_session* s : sessions) locks.emplace_back(s->mu);
    SSA_RETURN_IF_ERROR(backend.decode_steps(items, n_items, layer, p, seed, stats != nullptr ? &fresh : nullptr));
  }
  if (stats != nullptr) write_struct(fresh, stats);
  return absl::OkStatus();
}

}  // namespace ssa
