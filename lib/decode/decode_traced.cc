// ssa_decode_traced: a decode that also hands the caller the rows each query head
// read. The decode runs into scratch memory first, so that a trace buffer found
// too small leaves out, stats and the buffers untouched (the offsets excepted,
// which tell the caller the capacity needed).
#include "decode_traced.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend.h"
#include "caller_buffers.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {
namespace {

// One head's rows in ascending token order, log_pi permuted with them.
void sort_trace(HeadTrace* t) {
  const size_t n = t->tokens.size();
  if (std::is_sorted(t->tokens.begin(), t->tokens.end())) return;
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return t->tokens[a] < t->tokens[b]; });
  std::vector<uint32_t> tokens(n);
  std::vector<float> log_pi(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = t->tokens[order[i]];
    log_pi[i] = t->log_pi[order[i]];
  }
  t->tokens.swap(tokens);
  t->log_pi.swap(log_pi);
}

}  // namespace

absl::Status decode_traced(ssa_session& s, uint32_t layer, const void* q, void* out,
                           const ssa_decode_params& p, ssa_decode_stats* stats, const TraceBuffers& buf) {
  if (buf.head_offsets == nullptr) return invalid_argument("head_offsets must not be NULL");
  if (buf.tokens == nullptr && buf.capacity > 0) {
    return invalid_argument("tokens is NULL but capacity is ", buf.capacity);
  }
  if (!s.backend->records_traces()) {
    return unsupported("ssa_decode_traced: this session's backend selects rows on the device and does not "
                       "report them; use a CPU session");
  }
  if (q == nullptr || out == nullptr) return invalid_argument("q and out must not be NULL");
  if (stats != nullptr) SSA_RETURN_IF_ERROR(check_output_struct(stats));
  // No array holds more entries (8 bytes each at most: the sizes below cannot wrap).
  if (buf.capacity > static_cast<uint64_t>(PTRDIFF_MAX) / sizeof(uint64_t)) {
    return invalid_argument("capacity ", buf.capacity, " is larger than any array");
  }
  const size_t cap = static_cast<size_t>(buf.capacity);
  SSA_RETURN_IF_ERROR(check_no_overlap({
      q_buffer(s, q),
      out_buffer(s, out),
      CallerBuffer{stats, stats != nullptr ? struct_size_of(stats) : 0, "stats", true},
      CallerBuffer{buf.tokens, cap * sizeof(uint32_t), "tokens", true},
      CallerBuffer{buf.log_pi, buf.log_pi != nullptr ? cap * sizeof(float) : 0, "log_pi", true},
      CallerBuffer{buf.head_offsets, (size_t{s.layout.n_q_heads} + 1) * sizeof(uint64_t), "head_offsets", true},
  }));

  // decode() makes every other check before it reads the layer. It decodes into
  // scratch memory, with an index the layer lacks trained into a copy: until the
  // trace is known to fit, nothing of the caller's or the session's changes.
  const size_t out_bytes = size_t{s.layout.n_q_heads} * s.layout.row_bytes();
  std::vector<uint8_t> scratch_out(out_bytes);
  ssa_decode_stats scratch_stats;
  ssa_decode_stats_init(&scratch_stats);
  std::vector<HeadTrace> traces;
  LayerStore trained;
  SSA_RETURN_IF_ERROR(decode(s, layer, q, scratch_out.data(), p, stats != nullptr ? &scratch_stats : nullptr,
                             &traces, nullptr, &trained));
  if (traces.size() != s.layout.n_q_heads) {
    return internal_error("decode recorded ", traces.size(), " head traces for ", s.layout.n_q_heads, " heads");
  }

  uint64_t total = 0;
  buf.head_offsets[0] = 0;
  for (size_t h = 0; h < traces.size(); ++h) {
    total += traces[h].tokens.size();
    buf.head_offsets[h + 1] = total;
  }
  if (total > buf.capacity) {
    return invalid_argument("trace capacity ", buf.capacity, " is too small: this decode read ", total,
                            " rows over its ", traces.size(), " query heads (head_offsets[", traces.size(),
                            "] holds the capacity needed)");
  }
  for (size_t h = 0; h < traces.size(); ++h) {
    HeadTrace& t = traces[h];
    sort_trace(&t);
    const uint64_t at = buf.head_offsets[h];
    if (!t.tokens.empty()) memcpy(buf.tokens + at, t.tokens.data(), t.tokens.size() * sizeof(uint32_t));
    if (buf.log_pi != nullptr && !t.log_pi.empty()) {
      memcpy(buf.log_pi + at, t.log_pi.data(), t.log_pi.size() * sizeof(float));
    }
  }
  memcpy(out, scratch_out.data(), out_bytes);
  if (stats != nullptr) write_struct(scratch_stats, stats);
  // The call succeeded: the layer keeps the index it was decoded with, as after ssa_decode.
  if (trained.codebooks != nullptr) session_install_index(s, layer, std::move(trained));
  return absl::OkStatus();
}

}  // namespace ssa
