// The shared state of a sharded CUDA decode (lib/cuda/sharded_decode.cc) and
// the exchanges its ranks make between the pipeline's stages
// (sharded_selection.cc): each one a collective over every row of the batch
// (item x selection head), a rank contributing nothing for the items it does
// not hold, so that every rank makes the same calls whatever it holds.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "absl/status/status.h"
#include "kernels/decode_types.h"
#include "device_state.h"
#include "launch_set.h"
#include "shard/callback_collective.h"
#include "session.h"
#include "shard/collective.h"
#include "shard/shard_map.h"
#include "ssa.h"

namespace ssa::cuda::sharded {

// One item of the batch, as every rank sees it.
struct ItemWork {
  const LaunchJob* job = nullptr;
  DecodeItem global{};            // the unsharded item's ranges and budget
  bool dense = false;             // reads every token
  bool selects = false;           // chooses a heavy set (and samples)
  std::vector<ShardRange> range;  // per shard of the runtime; empty where it holds none of the item
  const void* q = nullptr;        // device memory of the first device
  void* out = nullptr;
  float* gather = nullptr;        // [n_q_heads][splits][head_dim + 2], first device
  uint32_t splits = 0;            // over every rank holding the item
  std::vector<uint32_t> split_offset;  // per shard: where its partials start
};

// One rank: a shard and the items it holds (batch order), planned on the host.
struct RankWork {
  uint32_t shard = 0;
  std::vector<uint32_t> items;
  std::vector<uint64_t> view_begin;  // per held item: its token 0 on this rank
  DecodeBatch b{};
  WorkspacePlan plan{};
};

// What every rank reads; each rank writes only its own slots (rank 0 the stats).
struct Shared {
  Shared(const ssa_session& s0, uint32_t li, const ssa_decode_params& p_, uint64_t seed_)
      : L(s0.layout), layer_index(li), p(p_), seed(seed_) {}
  const KvLayout& L;
  uint32_t layer_index;
  const ssa_decode_params& p;
  uint64_t seed;
  bool all_dense = false, selects = false, sampling = false, adaptive = false, mixture = false;
  uint32_t sel_heads = 0;  // selection rows per item
  std::vector<ItemWork> items;
  std::vector<RankWork> ranks;
  cudaEvent_t q_ready = nullptr;  // on the caller's stream, after q and the gather buffer
  std::vector<cudaEvent_t> done;  // per rank: its partials are in the gather buffers
  bool want_stats = false;
  // Per batch row (item x selection head), over all ranks (rank 0): heavy and
  // unique-sample counts, the residual's and the heavy set's proxy masses.
  std::vector<uint64_t> heavy, unique;
  std::vector<double> resid_mass, heavy_mass;
  std::vector<uint64_t> adaptive_heavy;  // |H| the adaptive rule chose per batch row
  // A rank of a group of processes (docs/DISTRIBUTED.md): the group, null for
  // the in-process ranks. Its one rank per process runs here; its partials go
  // to every rank through `send` (every item's [q head][send_splits][record],
  // send_splits the most any rank has), and `recv` (every rank's send) is laid
  // out into each item's gather buffer; every rank merges and reports stats.
  ProcessGroup* group = nullptr;
  float* send = nullptr;
  float* recv = nullptr;
  uint32_t send_splits = 0;
  std::vector<uint32_t> rank_splits;  // per rank: its launch set's split count
};

// The state of the rank running `shard` of session s: its shard's (in one
// process), or the session's own (a group's rank, one shard per process).
inline SessionState& rank_state(const Shared& sh, const ssa_session& s, uint32_t shard) {
  return sh.group != nullptr ? state(s) : shard_state(s, shard);
}


// An item's candidates on a rank: tokens [sink_end, local_begin) of its view.
inline uint32_t item_candidates(const DecodeItem& it) {
  return it.local_begin > it.sink_end ? it.local_begin - it.sink_end : 0;
}

// A rank's view of the batch rows: its own rows (item li, head h at li * ns + h)
// are the rows of its held items.
struct RowMap {
  const RankWork& rw;
  uint32_t ns;
  uint32_t local_rows() const { return static_cast<uint32_t>(rw.items.size()) * ns; }
  size_t batch_row(uint32_t local) const { return size_t{rw.items[local / ns]} * ns + local % ns; }
};


// The rows' maximum proxy score over every rank, into the rank's row states
// (m.ns rows per item: selection rows, or with ns = n_q_heads the mixture's
// per-head scratch rows); batch_max: every batch row's.
absl::Status share_row_max(Collective& comm, const RowMap& m, uint32_t batch_rows, RowState* rows,
                           cudaStream_t stream, std::vector<uint32_t>* batch_max);

// The mixture proposal's selection-row logits from every shard's q-head terms.
absl::Status mixture_logits(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                            const WorkspacePlan& plan, const Workspace& ws, cudaStream_t stream);

// Per batch row, the items' budget field (n_heavy, or n_select: the adaptive
// rule's k'), 0 for items that select nothing.
std::vector<uint64_t> row_budgets(const Shared& sh, uint32_t DecodeItem::*field);

// The adaptive rule's |H| of every batch row, the same on every rank.
absl::Status adaptive_heavy_counts(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                                   const WorkspacePlan& plan, const Workspace& ws,
                                   const std::vector<uint32_t>& batch_max, cudaStream_t stream,
                                   std::vector<uint64_t>* heavy);

// The global top-k of every row (k per batch row) into the heavy bitmap.
absl::Status select_heavy(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                          const Workspace& ws, const std::vector<uint64_t>& k, cudaStream_t stream);

// The rank's rows' |H| and m once the adaptive rule has chosen |H|.
absl::Status set_row_budgets(const RowMap& m, const DecodeBatch& b, const std::vector<uint64_t>& heavy,
                             bool sampling, RowState* rows, cudaStream_t stream);

// The residual draws of every row, split over the ranks by residual mass.
absl::Status draw_samples(Collective& comm, const RowMap& m, uint32_t batch_rows, const DecodeBatch& b,
                          const WorkspacePlan& plan, const Workspace& ws, cudaStream_t stream);

// The rows' stats over every rank, into sh (rank 0).
absl::Status gather_stats(Collective& comm, Shared& sh, const RowMap& m, const std::vector<RowState>& rs);

}  // namespace ssa::cuda::sharded
