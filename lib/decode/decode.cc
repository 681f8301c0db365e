#include "decode.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend.h"
#include "cpu/finite_check.h"
#include "decode_plan.h"
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
  const size_t bytes = nq * s->layout.elem_bytes();
  const uint8_t* qb = static_cast<const uint8_t*>(q);
  const uint8_t* ob = static_cast<const uint8_t*>(out);
  if (qb < ob + bytes && ob < qb + bytes) return invalid_argument("q and out overlap");
  SSA_RETURN_IF_ERROR(s->backend->check_buffer(*s, q, "q"));
  SSA_RETURN_IF_ERROR(s->backend->check_buffer(*s, out, "out"));
  const size_t bad = host_buffers(*s) ? first_non_finite(s->layout.dtype, q, nq) : nq;
  if (bad != nq) return invalid_argument("q[", bad, "] is NaN or infinite");
  return absl::OkStatus();
}

// Runs the pipeline under a reader lock; a proxy method on a layer without an
// index first trains it (exclusively) and then retries.
absl::Status locked_decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                           const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats,
                           std::vector<HeadTrace>* traces, DecodeProfile* profile) {
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
    }
    SSA_RETURN_IF_ERROR(session_ensure_index(s, layer));
  }
  return make_error(SSA_ERR_BUSY, "layer index kept changing under decode");
}

uint64_t resolve_seed(const ssa_session& s, const ssa_decode_params& p) {
  return p.seed != 0 ? p.seed : s.rt->seed;
}

}  // namespace

absl::Status decode(ssa_session& s, uint32_t layer, const void* q, void* out,
                    const ssa_decode_params& p, ssa_decode_stats* stats,
                    std::vector<HeadTrace>* traces, DecodeProfile* profile) {
  SSA_RETURN_IF_ERROR(validate_decode_params(p));
  SSA_RETURN_IF_ERROR(check_item(&s, layer, q, out));
  // Refused before an index could be trained for it.
  SSA_RETURN_IF_ERROR(s.backend->check_decode(p));
  if (p.group_selection != SSA_GROUP_OFF && p.target_error > 0.0f) return unsupported(kGroupNoErrorTarget);
  if (stats != nullptr) {
    SSA_RETURN_IF_ERROR(check_output_struct(stats));
    ssa_decode_stats fresh{};
    SSA_RETURN_IF_ERROR(locked_decode(s, layer, q, out, p, resolve_seed(s, p), &fresh, traces, profile));
    write_struct(fresh, stats);
    return absl::OkStatus();
  }
  return locked_decode(s, layer, q, out, p, resolve_seed(s, p), nullptr, traces, profile);
}

// No item's out may overlap any q or another item's out (qs may share memory).
// One sweep over the buffers sorted by address: O(n log n) for large batches.
absl::Status check_batch_buffers(const ssa_decode_item* items, size_t n_items) {
  struct Span {
    uintptr_t begin, end;
    size_t item;
    bool out;
  };
  std::vector<Span> spans;
  spans.reserve(2 * n_items);
  for (size_t i = 0; i < n_items; ++i) {
    const size_t bytes = size_t{items[i].session->layout.n_q_heads} * items[i].session->layout.row_bytes();
    const auto q = reinterpret_cast<uintptr_t>(items[i].q), o = reinterpret_cast<uintptr_t>(items[i].out);
    spans.push_back(Span{q, q + bytes, i, false});
    spans.push_back(Span{o, o + bytes, i, true});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  // The furthest-reaching span seen so far, of any kind and of outs only.
  const Span* reach_any = nullptr;
  const Span* reach_out = nullptr;
  for (const Span& c : spans) {
    const Span* hit = c.out ? reach_any : reach_out;
    if (hit != nullptr && c.begin < hit->end) {
      const size_t out_item = c.out ? c.item : hit->item, other = c.out ? hit->item : c.item;
      return invalid_argument("item ", out_item, ": out overlaps q or out of item ", other);
    }
    if (reach_any == nullptr || c.end > reach_any->end) reach_any = &c;
    if (c.out && (reach_out == nullptr || c.end > reach_out->end)) reach_out = &c;
  }
  return absl::OkStatus();
}

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
  SSA_RETURN_IF_ERROR(items[0].session->backend->check_decode(p));
  for (size_t i = 0; i < n_items; ++i) SSA_RETURN_IF_ERROR(session_settle(*items[i].session, false));
  return items[0].session->backend->decode_batch(items, n_items, layer, p);
}

}  // namespace ssa
