// The CPU decode pipeline of one layer: for every query head, (1) proxy scores of
// the candidates (PQ lookup tables, or exact scores for the oracle), (2) heavy
// set, (3) residual sampling, (4) attention over sink + local + selection.
// Dense requests run a split-K scan over the pages instead.
#pragma once

#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

// The rows one query head read and their log inclusion probabilities (0 for
// sink, local and heavy rows). Dense decodes read every row.
struct HeadTrace {
  std::vector<uint32_t> tokens;
  std::vector<float> log_pi;
};

// Seconds spent per stage, summed over query heads (thread time, not wall time).
struct DecodeProfile {
  double scoring = 0, heavy = 0, sampling = 0, attention = 0;
};

// Decodes one layer of a session whose lock the caller holds (reader) and whose
// layer has a PQ index when the method needs one. q/out in the session's dtype.
// stats accumulates (is added to); traces, when not null, receives n_q_heads traces.
absl::Status cpu_decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                              const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                              ssa_decode_stats* stats, std::vector<HeadTrace>* traces,
                              DecodeProfile* profile = nullptr);

}  // namespace ssa
