#include "group_call_check.h"

#include <string.h>
#include <xxhash.h>

#include <vector>

#include "status.h"

namespace ssa {
namespace {

// The parameters that decide the selection and the output (not the stream, a
// pointer of this process).
uint64_t params_hash(const ssa_decode_params& p) {
  struct {
    int32_t method, group_selection;
    uint32_t budget, n_sink, n_local, max_budget;
    float sparsity, heavy_fraction, pi_min, target_error, target_delta, pad;
  } f{};
  f.method = static_cast<int32_t>(p.method);
  f.group_selection = static_cast<int32_t>(p.group_selection);
  f.budget = static_cast<uint32_t>(p.budget);
  f.n_sink = static_cast<uint32_t>(p.n_sink);
  f.n_local = static_cast<uint32_t>(p.n_local);
  f.max_budget = static_cast<uint32_t>(p.max_budget);
  f.sparsity = p.sparsity;
  f.heavy_fraction = p.heavy_fraction;
  f.pi_min = p.pi_min;
  f.target_error = p.target_error;
  f.target_delta = p.target_delta;
  return XXH3_64bits(&f, sizeof f);
}

}  // namespace

const char* group_call_name(uint64_t kind) {
  switch (static_cast<GroupCall>(kind)) {
    case GroupCall::kDecode:
      return "a decode";
    case GroupCall::kTrain:
      return "an index training";
    case GroupCall::kSave:
      return "a save";
    case GroupCall::kLoad:
      return "a load";
  }
  return "an unknown call";
}

absl::Status begin_call(ProcessGroup& g, const CallSummary& mine_in, absl::Status local,
                        const char* const* names) {
  CallSummary mine = mine_in;
  mine.status = local.ok() ? 0 : static_cast<uint64_t>(status_code(local));
  std::vector<CallSummary> all(g.size());
  SSA_RETURN_IF_ERROR(g.all_gather(&mine, sizeof mine, all.data()));
  if (!local.ok()) return local;
  for (uint32_t r = 0; r < g.size(); ++r) {
    const CallSummary& c = all[r];
    if (c.kind != mine.kind) {
      return invalid_argument("rank ", r, " of the group is in ", group_call_name(c.kind), " where rank ", g.rank(),
                              " is in ", group_call_name(mine.kind),
                              ": every rank must make the same calls in the same order");
    }
  }
  for (uint32_t r = 0; r < g.size(); ++r) {
    if (all[r].status != 0) {
      return make_error(static_cast<ssa_status>(all[r].status),
                        absl::StrCat(group_call_name(mine.kind), " of a group: rank ", r, " failed (",
                                     ssa_status_string(static_cast<ssa_status>(all[r].status)),
                                     ", its message is on that rank); nothing changed on any rank"));
    }
  }
  for (uint32_t r = 0; r < g.size(); ++r) {
    for (int f = 0; f < kSummaryFields; ++f) {
      if (all[r].field[f] == mine.field[f]) continue;
      return invalid_argument(group_call_name(mine.kind), " of a group: rank ", r, " and rank ", g.rank(),
                              " differ in ", names[f] != nullptr ? names[f] : "an argument", " (rank ", r, ": ",
                              all[r].field[f], ", rank ", g.rank(), ": ", mine.field[f],
                              "); every rank must make the same calls with the same arguments");
    }
  }
  return absl::OkStatus();
}

absl::Status agree(ProcessGroup& g, const absl::Status& local, const char* what) {
  const uint64_t mine = local.ok() ? 0 : static_cast<uint64_t>(status_code(local));
  std::vector<uint64_t> all(g.size());
  SSA_RETURN_IF_ERROR(g.all_gather(&mine, sizeof mine, all.data()));
  if (!local.ok()) return local;
  for (uint32_t r = 0; r < g.size(); ++r) {
    if (all[r] == 0) continue;
    return make_error(static_cast<ssa_status>(all[r]),
                      absl::StrCat(what, " of a group: rank ", r, " failed (",
                                   ssa_status_string(static_cast<ssa_status>(all[r])),
                                   ", its message is on that rank); nothing changed on any rank"));
  }
  return absl::OkStatus();
}

uint64_t q_summary(const KvLayout& layout, const void* q_host) {
  return XXH3_64bits(q_host, size_t{layout.n_q_heads} * layout.head_dim * layout.elem_bytes());
}

absl::Status check_same_call(ProcessGroup& g, const LayerStore& layer, uint32_t layer_index, uint64_t q_hash,
                             const ssa_decode_params& p, uint64_t seed, absl::Status local) {
  static const char* const kNames[kSummaryFields] = {
      "layer", "layer length (every rank must append the same rows)", "PQ index (trained at another length)",
      "q", "decode parameters", "seed", "decode parameters (step)", nullptr};
  CallSummary mine;
  mine.kind = static_cast<uint64_t>(GroupCall::kDecode);
  mine.field[0] = layer_index;
  mine.field[1] = layer.n_tokens;
  mine.field[2] = layer.codebooks != nullptr ? layer.trained_at_tokens : 0;
  mine.field[3] = q_hash;
  mine.field[4] = params_hash(p);
  mine.field[5] = seed;
  mine.field[6] = p.step;
  return begin_call(g, mine, std::move(local), kNames);
}

}  // namespace ssa
