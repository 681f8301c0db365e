#include "group_call_check.h"

#include <string.h>
#include <xxhash.h>

#include <vector>

#include "status.h"

namespace ssa {
namespace {

struct CallSummary {
  uint64_t layer_index, n_tokens, trained_at_tokens, q_hash, params_hash, seed, step, pad;
};

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

absl::Status check_same_call(ProcessGroup& g, const KvLayout& layout, const LayerStore& layer,
                             uint32_t layer_index, const void* q, const ssa_decode_params& p, uint64_t seed) {
  const CallSummary mine{layer_index,
                         layer.n_tokens,
                         layer.codebooks != nullptr ? layer.trained_at_tokens : 0,
                         XXH3_64bits(q, size_t{layout.n_q_heads} * layout.head_dim * layout.elem_bytes()),
                         params_hash(p),
                         seed,
                         p.step,
                         0};
  std::vector<CallSummary> all(g.size());
  SSA_RETURN_IF_ERROR(g.all_gather(&mine, sizeof mine, all.data()));
  for (uint32_t r = 0; r < g.size(); ++r) {
    const CallSummary& c = all[r];
    const char* what = nullptr;
    if (c.layer_index != mine.layer_index) {
      what = "layer";
    } else if (c.n_tokens != mine.n_tokens) {
      what = "layer length (every rank must append the same rows)";
    } else if (c.trained_at_tokens != mine.trained_at_tokens) {
      what = "PQ index (trained at another length)";
    } else if (c.q_hash != mine.q_hash) {
      what = "q";
    } else if (c.params_hash != mine.params_hash || c.step != mine.step) {
      what = "decode parameters";
    } else if (c.seed != mine.seed) {
      what = "seed";
    }
    if (what != nullptr) {
      return invalid_argument("decode of a group: rank ", r, " and rank ", g.rank(), " differ in ", what,
                              " (rank ", r, ": layer ", c.layer_index, " of ", c.n_tokens, " tokens; rank ",
                              g.rank(), ": layer ", mine.layer_index, " of ", mine.n_tokens,
                              " tokens); every rank must make the same calls with the same arguments");
    }
  }
  return absl::OkStatus();
}

}  // namespace ssa
