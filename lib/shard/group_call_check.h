// Every collective call of a group of processes (a decode, an index training,
// a save, a load) starts with one all-gather of a fixed-size summary of the
// call, so that ranks which are not making the same call find out at an
// exchange whose size they agree on: a rank that appended other rows, passed
// another q or is in another call would otherwise take part in exchanges that
// are nobody's (every rank's result wrong, silently, or buffers of different
// sizes paired). The summary also carries the rank's own failure before the
// exchange, so its peers return at once with it instead of waiting. Calls that
// change state end with `agree`: every rank keeps its change only when none
// failed.
#pragma once

#include <stdint.h>

#include "absl/status/status.h"
#include "callback_collective.h"
#include "ssa.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

enum class GroupCall : uint64_t { kDecode = 1, kTrain = 2, kSave = 3, kLoad = 4 };
const char* group_call_name(uint64_t kind);

inline constexpr int kSummaryFields = 8;

// What one rank says of its call: every field must be the same on every rank.
struct CallSummary {
  uint64_t kind = 0;    // a GroupCall
  uint64_t status = 0;  // this rank's ssa_status from before the exchange (0: none)
  uint64_t field[kSummaryFields] = {};
};
static_assert(sizeof(CallSummary) == 80);

// One all-gather of the summaries. Returns `local` when it failed; else the
// first other rank's failure (its status code, its rank); INVALID_ARGUMENT
// when a rank makes another call or a field differs (named by `names`, which
// has kSummaryFields entries, null for unused fields). Caller holds the
// group's call mutex. Ranks that disagree all return at this exchange: the
// group stays in step.
absl::Status begin_call(ProcessGroup& g, const CallSummary& mine, absl::Status local,
                        const char* const* names);

// The last exchange of a call that changes state: one all-gather of every
// rank's result. Returns `local` when it failed, else the first failing rank's
// status code with a message naming it and `what`; OK when every rank succeeded.
absl::Status agree(ProcessGroup& g, const absl::Status& local, const char* what);

// A decode's summary (layer, length, index, q, parameters, seed, step): the
// first exchange of every decode of a group. q_hash: q_summary of the rank's
// q; local: this rank's failure before the exchange (its peers return it).
absl::Status check_same_call(ProcessGroup& g, const LayerStore& layer, uint32_t layer_index, uint64_t q_hash,
                             const ssa_decode_params& p, uint64_t seed, absl::Status local = absl::OkStatus());

// The hash of q (host memory, n_q_heads rows of the layout) a decode's summary carries.
uint64_t q_summary(const KvLayout& layout, const void* q_host);

}  // namespace ssa
