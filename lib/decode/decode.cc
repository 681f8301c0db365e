#include "decode.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend.h"
#include "caller_buffers.h"
#include "cpu/finite_check.h"
#include "decode_plan.h"
#include "shard/sharded_decode.h"
#include "decode_step.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {
namespace {

absl::Status check_item(const ssa_session* s, uint32_t layer, const void* q, const void* out) {
  if (s == nullptr) return invalid_argument("session is NULL");
  if (q == nullptr || out == nullptr) return invalid_argument("q and out must not be NULL");
  if (layer >= s->layout.n_layers) {
    return invalid_argument("layer ", layer, " >= n_layers ", s->layout.n_layers);
  }
  const size_t nq = size_t{s->layout.n_q_heads} * s->layout.head_dim;
  SSA_RETURN_IF_ERROR(s->backend->check_buffer(*s, q, "q"));
  SSA_RETURN_IF_ERROR(s->backend->check_buffer(*s, out, "out"));
  const size_t bad = host_buffers(*s) ? first_non_finite(s->layout.dtype, q, nq) : nq;
  if (bad != nq) return invalid_argument("q[", bad, "] is NaN or infinite");
  return absl::OkStatus();
}

// Runs the pipeline under a reader lock; a proxy method on a layer without an
// index first trains it (exclusively) and then retries, or, with `trained`,
// trains it into a copy of the layer that the decode reads and the session
// does not get (the caller installs it once its call has succeeded).
absl::Status locked_decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                           const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats,
                           std::vector<HeadTrace>* traces, DecodeProfile* profile, LayerStore* trained) {
  SSA_RETURN_IF_ERROR(session_settle(s, false));  // tokens that decode steps appended
  for (int attempt = 0; attempt < 3; ++attempt) {
    {
      std::shared_lock lock(s.mu);
      const LayerStore& l = s.layers[layer];
      if (l.n_tokens == 0) return invalid_argument("layer ", layer, " holds no tokens");
      const DecodePlan plan = plan_decode(l.n_tokens, p);
      const bool needs_index = plan_needs_index(plan, p.method);
      if (!needs_index || l.codebooks != nullptr) {
        return s.backend->decode_layer(s, l, layer, q, out, p, seed, stats, traces, profile);
      }
      // A group trains collectively: its ranks first check that they are all
      // making this decode (the decode itself checks again).
      if (s.rt->group != nullptr) SSA_RETURN_IF_ERROR(check_group_decode(s, l, layer, q, p, seed));
      if (trained != nullptr) {
        *trained = l;
        SSA_RETURN_IF_ERROR(s.backend->train_index(s, *trained));
        return s.backend->decode_layer(s, *trained, layer, q, out, p, seed, stats, traces, profile);
      }
    }
    SSA_RETURN_IF_ERROR(session_ensure_index(s, layer));
  }
  return make_error(SSA_ERR_BUSY, "layer index kept changing under decode");
}

uint64_t resolve_seed(const ssa_session& s, const ssa_decode_params& p) {
  return p.seed != 0 ? p.seed : s.rt->seed;
}

}  // namespace

absl::Status check_decode_request(const ssa_session& s, uint32_t layer, const ssa_decode_params& p) {
  if (p.group_selection != SSA_GROUP_OFF && p.target_error > 0.0f) return unsupported(kGroupNoErrorTarget);
  if (runtime_sharded(*s.rt) && p.target_error > 0.0f) return unsupported(kShardedTargetUnsupported);
  return s.backend->check_decode(s, layer, p);
}

CallerBuffer q_buffer(const ssa_session& s, const void* q, size_t item) {
  return CallerBuffer{q, size_t{s.layout.n_q_heads} * s.layout.row_bytes(), "q", false, item};
}

CallerBuffer out_buffer(const ssa_session& s, const void* out, size_t item) {
  return CallerBuffer{out, size_t{s.layout.n_q_heads} * s.layout.row_bytes(), "out", true, item};
}

absl::Status decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                    const ssa_decode_params& p, ssa_decode_stats* stats,
                    std::vector<HeadTrace>* traces, DecodeProfile* profile, LayerStore* trained) {
  // Every check that can refuse, before anything lazy (an index trained on demand).
  SSA_RETURN_IF_ERROR(validate_decode_params(p));
  SSA_RETURN_IF_ERROR(check_item(&s, layer, q, out));
  if (stats != nullptr) SSA_RETURN_IF_ERROR(check_output_struct(stats));
  SSA_RETURN_IF_ERROR(check_no_overlap(
      {q_buffer(s, q), out_buffer(s, out), CallerBuffer{stats, stats != nullptr ? struct_size_of(stats) : 0,
                                                        "stats", true}}));
  SSA_RETURN_IF_ERROR(check_decode_request(s, layer, p));
  if (traces != nullptr && s.rt->group != nullptr) return unsupported(kGroupTracesUnsupported);
  if (stats != nullptr) {
    ssa_decode_stats fresh{};
    SSA_RETURN_IF_ERROR(locked_decode(s, layer, q, out, p, resolve_seed(s, p), &fresh, traces, profile, trained));
    write_struct(fresh, stats);
    return absl::OkStatus();
  }
  return locked_decode(s, layer, q, out, p, resolve_seed(s, p), nullptr, traces, profile, trained);
}

namespace {

// No item's out may overlap any q or another item's out (qs may share memory).
absl::Status check_batch_buffers(const ssa_decode_item* items, size_t n_items) {
  std::vector<CallerBuffer> buffers;
  buffers.reserve(2 * n_items);
  for (size_t i = 0; i < n_items; ++i) {
    buffers.push_back(q_buffer(*items[i].session, items[i].q, i));
    buffers.push_back(out_buffer(*items[i].session, items[i].out, i));
  }
  return check_no_overlap(std::move(buffers));
}

}  // namespace

absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                          const ssa_decode_params& p) {
  if (n_items == 0) return absl::OkStatus();
  if (items == nullptr) return invalid_argument("items is NULL");
  // Before any item is read: no array holds more (PTRDIFF_MAX bytes at most).
  if (n_items > static_cast<size_t>(PTRDIFF_MAX) / sizeof(ssa_decode_item)) {
    return invalid_argument("n_items ", n_items, " is larger than any array of items");
  }
  SSA_RETURN_IF_ERROR(validate_decode_params(p));
  const ssa_runtime* rt = items[0].session != nullptr ? items[0].session->rt : nullptr;
  for (size_t i = 0; i < n_items; ++i) {
    absl::Status st = check_item(items[i].session, layer, items[i].q, items[i].out);
    if (st.ok() && items[i].session->rt != rt) {
      st = invalid_argument("sessions of different runtimes");
    }
    if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
  }
  SSA_RETURN_IF_ERROR(check_batch_buffers(items, n_items));
  // What the backend would refuse, and empty layers, for every item before any
  // is decoded (an index trained for one item would outlive another's refusal).
  for (size_t i = 0; i < n_items; ++i) {
    absl::Status st = check_decode_request(*items[i].session, layer, p);
    if (st.ok()) {
      std::shared_lock lock(items[i].session->mu);
      if (items[i].session->layers[layer].n_tokens == 0) st = invalid_argument("layer ", layer, " holds no tokens");
    }
    if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
  }
  for (size_t i = 0; i < n_items; ++i) SSA_RETURN_IF_ERROR(session_settle(*items[i].session, false));
  return items[0].session->backend->decode_batch(items, n_items, layer, p);
}

}  // namespace ssa
