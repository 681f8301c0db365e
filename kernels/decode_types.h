// Plain descriptors shared by the CUDA decode kernels and their host-side callers.
// Host C++ (lib/cuda, tests) includes this header without the CUDA compiler, so it
// holds only POD structs over raw device pointers: no CUDA types, no templates.
//
// One decode launch set serves up to kMaxBatchItems (session, query) items that
// share one shape (heads, head dim, dtype, page size, PQ shape) but may differ in
// length. The whole batch is passed to every kernel by value, so a launch set
// needs no host-to-device copies and can be captured into a CUDA graph.
// A decode step (lib/cuda/graph_step.h) instead plans its items on the device
// (kernels/step_plan.h: lengths read from device memory) into items_dev, which
// every kernel then reads through DecodeBatch::item().
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

namespace ssa::cuda {

constexpr uint32_t kMaxBatchItems = 32;
constexpr uint32_t kScoreBins = 1024;      // top-k histogram bins (ScoreBins, device_util.cuh)
constexpr uint32_t kMaxCompactBlocks = 256;  // thread blocks per row compacting the bitmaps
constexpr uint32_t kMaxSplits = 256;       // attention splits per row (split-K)
constexpr uint32_t kCutListMin = 4096;     // boundary-bin list entries per row, at least
constexpr uint32_t kMaxSampledCandidates = (1u << 26) - 1;  // fixed-point weight sums fit 64 bits

struct DecodeShape {
  uint32_t n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  uint32_t page_tokens = 0, page_shift = 0;  // page_tokens == 1 << page_shift
  uint32_t pq_subspaces = 0, pq_centroids = 0;
  DType dtype = DType::kF16;
  // 8: a code byte per subspace; 4: two subspaces per byte (the even one in the
  // low nibble), scored from 8-bit tables as the CPU backend does (pq_score.cu).
  uint32_t pq_code_bits = 8;
  SSA_HD uint32_t group() const { return n_q_heads / n_kv_heads; }
  SSA_HD uint32_t code_rows() const { return pq_code_bits == 4 ? pq_subspaces / 2 : pq_subspaces; }
};

// One (session, layer, query) of a launch set. Every pointer is device memory.
// The token ranges follow docs/ALGORITHM.md (#fixed-tokens): [0, sink_end) and [local_begin, n_tokens)
// are always read with pi = 1, the candidates C are [sink_end, local_begin).
struct DecodeItem {
  const uint8_t* const* kv_pages = nullptr;    // one device pointer per KV page
  const uint8_t* const* code_pages = nullptr;  // one per code page (PQ proxy only)
  const float* codebooks = nullptr;            // [n_kv][M][K][sub_dim] (PQ proxy only)
  // OPQ, QPQ: the matrix each KV head's query is multiplied by before its
  // lookup table is built ([n_kv][d][d] row-major: R, or T^-T); null otherwise.
  const float* query_transform = nullptr;
  const void* q = nullptr;                     // [n_q_heads][head_dim], kv dtype
  void* out = nullptr;                         // [n_q_heads][head_dim], kv dtype
  uint32_t n_tokens = 0;
  // Tokens [0, first_token) of the pages are not the item's (a sharded decode's
  // range starting inside a page): neither read nor candidates; sink_end >= it.
  uint32_t first_token = 0;
  uint32_t sink_end = 0, local_begin = 0;
  uint32_t n_select = 0;  // k' = |H| + m (0 for a dense item: sink_end == n_tokens)
  uint32_t n_heavy = 0;   // |H| for a fixed heavy fraction (adaptive: decided on device)
  // Workspace placement of this item's selection rows (filled by plan_workspace;
  // h: the selection head, DecodeBatch::sel_heads()).
  uint32_t n_pad = 0;        // n_tokens rounded up to whole 1024-token chunks
  uint64_t score_base = 0;   // floats: row h at score_base + h * n_pad
  uint64_t select_base = 0;  // u32 entries: row h at select_base + h * select_cap
  uint32_t select_cap = 0;   // >= n_select, >= 1
};

// Whether an item selects candidates (scores them, picks a heavy set, draws):
// it has candidates and a budget for them. A dense item has no candidates; a
// window-only item (budget below sink + local, docs/ALGORITHM.md#fixed-tokens)
// has candidates but reads none of them, so no stage may score them: such a
// layer may hold no index (no codebooks) at all. Every proxy and selection stage
// asks this one question.
SSA_HD bool item_selects(const DecodeItem& it) { return it.sink_end < it.local_begin && it.n_select > 0; }

// An idle item reads and writes nothing (no tokens; its out is left as it was):
// what a decode step planned on the device turns into when it may not run
// (kernels/step_plan.h: a reservation that ended, or one that is full). Every
// stage that does not already stop at !item_selects stops at this.
SSA_HD bool item_idle(const DecodeItem& it) { return it.n_tokens == 0; }

enum class Proxy : uint32_t { kNone = 0, kPq = 1, kExact = 2 };
enum class HeavyRule : uint32_t { kFixed = 0, kAdaptive = 1 };
enum class Sampling : uint32_t { kNone = 0, kProxy = 1, kUniform = 2 };
// Who a selection row serves (ssa_decode_params.group_selection,
// docs/GROUP_SELECTION.md): off, one row per q head; otherwise one row per KV
// head, whose selection and log pi every q head of the group attends with. The
// mean query scores with the group's mean query; the mixture scores every q head
// of the group into scratch rows first and selects from the mixture of their
// proxy softmaxes (group_mixture.cu).
enum class GroupProposal : uint32_t { kOff = 0, kMeanQuery = 1, kMixture = 2 };

struct DecodeBatch {
  DecodeShape shape;
  uint32_t n_items = 0;
  Proxy proxy = Proxy::kNone;       // kNone: every item is dense
  HeavyRule heavy = HeavyRule::kFixed;
  Sampling sampling = Sampling::kNone;
  float pi_min = 1e-4f;
  uint32_t layer = 0;
  uint64_t seed = 0, step = 0;
  // When set, item i's RNG step is read from step_dev[i] (decode steps: written
  // by the step's plan kernel before the first stage).
  const uint64_t* step_dev = nullptr;
  // When set, the items are read from here (device memory, n_items of them,
  // written before the first stage by a decode step's plan kernel); `items`
  // then holds the shapes the host planned the launches for (every item at the
  // reservation's capacity), which bound the device items'.
  const DecodeItem* items_dev = nullptr;
  uint32_t n_splits = 0;               // attention splits per row; 0 = automatic
  bool overlap_launches = true;        // programmatic dependent launch between stages (stage_launch.cuh)
  GroupProposal group = GroupProposal::kOff;
  // Error-targeted decode (lib/cuda/targeted_decode.cc): the sampler also lists
  // every draw's token in draw order (Workspace::draw_tokens), which the error
  // estimate (kernels/error_estimate.cu) reads with its multiplicity.
  bool record_draws = false;
  DecodeItem items[kMaxBatchItems];

  // Item i as the kernels see it. Kernels take the batch as a __grid_constant__
  // parameter, so the reference into `items` needs no local copy of the batch.
  SSA_HD const DecodeItem& item(uint32_t i) const { return items_dev != nullptr ? items_dev[i] : items[i]; }
  SSA_HD uint64_t step_of(uint32_t i) const { return step_dev != nullptr ? step_dev[i] : step; }

  // Selection rows (scores, top-k, sampling, compaction, RowState) per item: one
  // per q head, or one per KV head with group selection. The attention and its
  // split partials keep one row per q head.
  SSA_HD bool grouped() const { return group != GroupProposal::kOff; }
  SSA_HD uint32_t sel_heads() const { return grouped() ? shape.n_kv_heads : shape.n_q_heads; }
  // Selection rows per KV head (the heads one PQ scoring pass serves together).
  SSA_HD uint32_t sel_group() const { return grouped() ? 1u : shape.group(); }
  // The selection row (within its item) that q head h attends with.
  SSA_HD uint32_t sel_head_of(uint32_t h) const { return grouped() ? h / shape.group() : h; }
  // The q head whose Philox stream selection row `sel_head` draws from: with
  // group selection the group's first q head (the CPU's key), so a group of one
  // draws what its head draws without group selection.
  SSA_HD uint32_t rng_head(uint32_t sel_head) const { return grouped() ? sel_head * shape.group() : sel_head; }
};

// A sharded decode (lib/cuda/sharded_decode.cc): where a rank's items sit in the
// batch of every rank (its item i is batch item batch_item[i]).
struct ShardBatchItems {
  uint32_t batch_item[kMaxBatchItems];
};

// A sharded decode's mixture proposal: a q head's row of the batch, its largest
// proxy score over every shard and its candidates' chunk count.
struct ShardMixtureRow {
  uint32_t max_key, n_chunks;
};

// Per-row (item, selection head) state kept in device memory during one decode.
struct RowState {
  uint32_t max_key;    // order-preserving bits of the largest candidate proxy score
  uint32_t min_key;    // ... and of the smallest (the exact proxy's histogram range)
  float bin_scale, bin_offset;  // the top-k histogram's bins (ScoreBins), set by the kernel building it
  uint32_t topk_k;     // how many candidates top-k keeps in this row
  uint32_t n_heavy;    // |H|
  uint32_t n_draws;    // m
  uint32_t n_unique;   // |S|
  uint32_t cut_bin;    // top-k: candidates in bins < cut_bin are selected outright,
  uint32_t cut_need;   //   cut_need of those in bin cut_bin (found among n_cut of them)
  uint32_t n_cut;
  double w_total;      // sum over the residual R of the fixed-point weights (cand_weight, device_util.cuh)
  double w_heavy;      // sum over H of exp(s~ - max) (statistics only, sampling methods)
  double w_all;        // adaptive: sum over C of exp(s~ - max)
  double w_resid_proxy;  // sum over R of exp(s~ - max), also when sampling uniformly
  // A sharded decode (lib/cuda/sharded_decode.cc): this shard's residual mass is
  // [mass_begin, mass_begin + its own total) of the row's mass_total over all
  // shards, and its sampler keeps the draws whose first-level target falls there.
  // mass_total 0: unsharded (the row's own total).
  uint64_t mass_begin, mass_total;
};

// Device buffers of one decode, carved from one allocation (see plan_workspace).
// Bitmaps hold one bit per candidate (offset j = token - sink_end), one 32-bit
// word per 32-candidate sampling block, laid out like bsum.
struct Workspace {
  float* lut = nullptr;            // proxy lookup tables, M*K per row (pq_score.cu: lut_offset)
  float* lut_range = nullptr;      // [rows][M][2] largest and mean entry of each subspace's table
  float* scores = nullptr;         // per-row proxy scores, -inf where masked
  uint32_t* cut = nullptr;         // [rows][cut_capacity] candidates of each row's top-k boundary bin
  uint32_t cut_capacity = 0;       // a longer boundary bin is found again by a scan (refine_kernel)
  uint64_t* bsum = nullptr;        // per 32-token block residual weight (fixed point)
  uint64_t* csum = nullptr;        // per 1024-token chunk residual weight (fixed point)
  uint64_t* cprefix = nullptr;     // inclusive prefix of csum per row
  uint32_t* heavy_bits = nullptr;  // bitmap of the heavy set H
  uint32_t* sample_bits = nullptr; // bitmap of the sampled tokens S
  uint32_t* hist = nullptr;        // [rows][kScoreBins] top-k histograms
  // [compact_passes][rows][compact_blocks] set bits of each compaction block, with
  // a ready flag (kernels/bitmap_compact.cu); zeroed with the row states.
  uint64_t* compact_counts = nullptr;
  uint32_t compact_blocks = 0, compact_passes = 0;
  uint32_t* heavy = nullptr;       // per-row heavy lists (select_base layout), token order
  uint32_t* uniq_sorted = nullptr; // per-row unique samples, token order
  float* log_pi = nullptr;         // log inclusion probability of each sorted sample
  uint32_t* sort_keys = nullptr;   // adaptive: score keys of the top-k' candidates
  uint32_t* sort_keys2 = nullptr;
  uint32_t* sort_vals2 = nullptr;
  double* probs = nullptr;         // adaptive: sorted candidate probabilities
  int* seg_begin = nullptr;        // [rows] segment offsets for segmented sorts
  int* seg_end = nullptr;
  RowState* rows = nullptr;        // [rows]
  float* partial = nullptr;        // [q rows][n_splits][head_dim + 2] split results
  // Mixture proposal only: every q head's proxy scores (the per-head layout:
  // item score_base * group, row h at + h * n_pad), their row states and
  // top-k histograms (written by the scoring kernels, unused), each 1024-token
  // chunk's sum of exp(s~ - max) and each q head's normaliser.
  float* head_scores = nullptr;
  RowState* head_rows = nullptr;
  uint32_t* head_hist = nullptr;
  double* head_csum = nullptr;
  // record_draws only: draw j's token of each row (select_base layout, n_draws
  // entries; unset when the row's residual weight is 0 and nothing is drawn).
  uint32_t* draw_tokens = nullptr;
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
};

struct WorkspacePlan {
  size_t total_bytes = 0;
  size_t off_lut = 0, off_lut_range = 0, off_scores = 0, off_cut = 0, off_bsum = 0, off_csum = 0, off_cprefix = 0;
  size_t off_heavy_bits = 0, off_sample_bits = 0, off_hist = 0, off_compact_counts = 0, off_heavy = 0;
  size_t off_uniq_sorted = 0, off_log_pi = 0;
  size_t off_sort_keys = 0, off_sort_keys2 = 0, off_sort_vals2 = 0;
  size_t off_probs = 0, off_seg_begin = 0, off_seg_end = 0, off_rows = 0, off_partial = 0;
  size_t off_head_scores = 0, off_head_rows = 0, off_head_hist = 0, off_head_csum = 0, off_draw_tokens = 0;
  size_t off_sort_temp = 0, sort_temp_bytes = 0;
  uint64_t score_floats = 0, select_entries = 0;
  uint32_t rows = 0;       // selection rows: items x DecodeBatch::sel_heads()
  uint32_t attn_rows = 0;  // attention rows: items x q heads
  uint32_t n_splits = 0, n_pad_max = 0, select_cap_max = 0;
  uint32_t scan_blocks = 0;  // thread blocks per row of the full-row passes (exact proxy's histogram, filter)
  uint32_t filter_blocks = 0;  // thread blocks per row of the top-k filter
  uint32_t score_tile = 0;   // tokens per PQ scoring block
  uint32_t compact_blocks = 0, compact_words = 0;  // bitmap compaction: blocks per row, words each
  uint32_t cut_capacity = 0;  // boundary-bin list entries per row (Workspace::cut_capacity)
  uint32_t compact_passes = 0;  // compactions per decode: 2 with the adaptive heavy rule
  uint32_t draws_max = 0;           // most draws of any row (sampling methods)
  uint32_t sample_group_draws = 4;  // sampler: draws per group of four lanes (4 or 2)
};

}  // namespace ssa::cuda
