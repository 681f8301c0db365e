// One decode launch set: workspace planning and the order of the stages.
//   dense:   attention over every token (GQA group shares K/V reads) + split merge.
//   sparse:  proxy scores (PQ or exact) with sink/local masked, per q head or,
//            with group selection, per KV head (the mean query's scores, or the
//            mixture of the group's proxy softmaxes) -> top-k heavy set
//            as a bitmap (fixed |H|, or top-k' then lambda water-filling) ->
//            residual sampling into a second bitmap (dedup for free) -> both
//            bitmaps compacted into token-ordered lists -> attention over sink,
//            local, H and the samples, per q head, or with group selection
//            per KV head for all of its q heads over the group's lists and log pi.
#include <algorithm>
#include <map>
#include <mutex>

#include "common/sampling_hierarchy.h"
#include "cuda_decode.h"
#include "head_dim.cuh"
#include "stages.h"

namespace ssa::cuda {
// Raises a kernel's dynamic shared-memory limit once per device. Not only above
// 48 KB: the default limit also counts the kernel's static shared memory.
cudaError_t ensure_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> granted;
  std::lock_guard<std::mutex> lock(mu);
  size_t& g = granted[{dev, kernel}];
  if (g >= bytes) return cudaSuccess;
  cudaFuncAttributes attr{};
  if ((e = cudaFuncGetAttributes(&attr, kernel)) != cudaSuccess) return e;
  if (bytes + attr.sharedSizeBytes <= 48 * 1024) {
    g = bytes;
    return cudaSuccess;
  }
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) g = bytes;
  return e;
}

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

const char* unsupported_shape(const DecodeShape& s, bool needs_pq) {
  if (!head_dim_supported(s.head_dim)) return "head_dim must be 32, 64, 128, 256 or 512";
  if (s.n_kv_heads == 0 || s.n_q_heads % s.n_kv_heads != 0) return "n_q_heads % n_kv_heads != 0";
  if (s.n_q_heads > 1024) return "more than 1024 query heads";
  if ((s.page_tokens & (s.page_tokens - 1)) != 0 || (1u << s.page_shift) != s.page_tokens)
    return "page_tokens must be a power of two";
  if (needs_pq) return pq_shape_unsupported(s);
  return nullptr;
}

cudaError_t plan_workspace(DecodeBatch* b, int sm_count, WorkspacePlan* plan) {
  if (b->n_items == 0 || b->n_items > kMaxBatchItems) return cudaErrorInvalidValue;
  WorkspacePlan p;
  const DecodeShape& s = b->shape;
  const uint32_t nq = s.n_q_heads, ns = b->sel_heads();
  p.rows = b->n_items * ns;
  p.attn_rows = b->n_items * nq;
  const bool mixture = b->group == GroupProposal::kMixture;
  const bool all_dense = b->proxy == Proxy::kNone;
  uint64_t score = 0, sel = 0;
  uint32_t max_tokens = 0, max_read = 0;
  for (uint32_t i = 0; i < b->n_items; ++i) {
    DecodeItem& it = b->items[i];
    if (it.n_tokens == 0) return cudaErrorInvalidValue;
    max_tokens = std::max(max_tokens, it.n_tokens);
    const bool dense = all_dense || it.sink_end >= it.local_begin;
    if (dense) {
      it.sink_end = it.local_begin = it.n_tokens;
      it.n_select = it.n_heavy = 0;
    }
    it.n_pad = dense ? kChunkTokens
                     : static_cast<uint32_t>((uint64_t{it.n_tokens} + kChunkTokens - 1) /
                                             kChunkTokens * kChunkTokens);
    it.score_base = score;
    score += uint64_t{ns} * it.n_pad;
    it.select_cap = std::max(it.n_select, 1u);
    it.select_base = sel;
    sel += uint64_t{ns} * it.select_cap;
    p.n_pad_max = std::max(p.n_pad_max, it.n_pad);
    p.select_cap_max = std::max(p.select_cap_max, it.select_cap);
    // A row's draws: its selection less the fixed heavy count (the adaptive rule's
    // is found on the device, so its bound is the whole selection).
    const uint32_t fixed_heavy = b->heavy == HeavyRule::kAdaptive ? 0u : std::min(it.n_heavy, it.n_select);
    p.draws_max = std::max(p.draws_max, it.n_select - fixed_heavy);
    const uint32_t read = dense ? it.n_tokens
                                : it.sink_end + (it.n_tokens - it.local_begin) + it.n_select;
    max_read = std::max(max_read, read);
  }
  if (all_dense) score = sel = 0;
  p.score_floats = score;
  p.select_entries = sel;
  if (sel > 0x7fffffffull) return cudaErrorInvalidValue;
  // Full-row passes: about 1024 blocks in all, at least 2048 tokens each.
  p.scan_blocks = std::clamp<uint32_t>((1024 + p.rows - 1) / p.rows, 1,
                                       std::min<uint32_t>(64, (p.n_pad_max + 2047) / 2048));
  p.filter_blocks = filter_blocks_per_row(p.n_pad_max, p.rows, p.scan_blocks, sm_count);
  // PQ scoring: every block loads its lookup tables once, so it takes as many
  // tokens as leave about two blocks per multiprocessor (whole 1024-token passes).
  {
    const uint64_t groups = uint64_t{s.n_kv_heads} * b->n_items;  // one pass per GQA group
    const uint64_t want = std::max<uint64_t>(1, 2ull * std::max(sm_count, 1) / std::max<uint64_t>(groups, 1));
    uint64_t tile = (p.n_pad_max + want - 1) / want;
    tile = std::max<uint64_t>(1024, (tile + 1023) / 1024 * 1024);
    p.score_tile = static_cast<uint32_t>(std::min<uint64_t>(tile, 1u << 30));
  }
  if (b->n_splits) {
    p.n_splits = std::min(b->n_splits, kMaxSplits);
  } else if (all_dense && dense_mma_supported(s)) {
    p.n_splits = dense_mma_splits(s, b->n_items, max_read, sm_count);
  } else if (!all_dense && group_attention(*b)) {
    // One block per (KV head, item) and split, or per q-head chunk of a group on
    // CUDA cores.
    if (group_gather_supported(s)) {
      p.n_splits = group_gather_splits(s, b->n_items * s.n_kv_heads, max_read, sm_count);
    } else {
      const uint32_t base = b->n_items * s.n_kv_heads * (s.group() / group_split_heads(s));
      uint32_t splits = (8u * static_cast<uint32_t>(std::max(sm_count, 1)) + base - 1) / base;
      splits = std::min(splits, (max_read + 63) / 64);
      p.n_splits = std::clamp<uint32_t>(splits, 1, kMaxSplits);
    }
  } else if (!all_dense && sparse_gather_supported(s)) {
    p.n_splits = sparse_gather_splits(s, p.attn_rows, max_read, sm_count);
  } else {
    const uint32_t base = all_dense ? s.n_kv_heads * (s.group() / dense_heads_per_block(s.group())) *
                                          b->n_items
                                    : p.attn_rows;
    uint32_t splits = (8u * static_cast<uint32_t>(std::max(sm_count, 1)) + base - 1) / base;
    splits = std::min(splits, (max_read + 63) / 64);
    p.n_splits = std::clamp<uint32_t>(splits, 1, kMaxSplits);
  }
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off = align_up(off + bytes, 256);
    return o;
  };
  const size_t rows = p.rows;
  // Lookup tables: one per selection row, or per q head for the mixture (whose
  // tables score every q head).
  const size_t lut_rows = mixture ? p.attn_rows : rows;
  p.off_lut = take(b->proxy == Proxy::kPq ? lut_rows * s.pq_subspaces * s.pq_centroids * 4 : 0);
  p.off_lut_range = take(b->proxy == Proxy::kPq ? lut_rows * s.pq_subspaces * 2 * 4 : 0);
  p.off_scores = take(score * 4);
  // Boundary-bin lists: a 16th of the longest row (at least what refine stages in
  // shared memory). Bins are narrow, so lists are usually far shorter; a longer
  // one (many equal or near-equal scores) is found again by scanning the row.
  // Sized like the scores, they took 1 GB at 1M tokens and batch 16.
  p.cut_capacity = static_cast<uint32_t>(std::min<uint64_t>(p.n_pad_max, std::max<uint64_t>(kCutListMin, p.n_pad_max / 16)));
  p.off_cut = take(all_dense ? 0 : size_t{p.rows} * p.cut_capacity * 4);
  p.off_bsum = take(score / kBlockTokens * 8);
  p.off_csum = take(score / kChunkTokens * 8);
  p.off_cprefix = take(score / kChunkTokens * 8);
  p.off_heavy_bits = take(score / 32 * 4);
  p.off_sample_bits = take(score / 32 * 4);
  p.off_hist = take(all_dense ? 0 : rows * kScoreBins * 4);
  p.compact_words = compact_words_per_block(p.n_pad_max, p.rows, sm_count);
  p.compact_blocks = (p.n_pad_max / 32 + p.compact_words - 1) / p.compact_words;
  p.compact_passes = all_dense ? 0 : b->heavy == HeavyRule::kAdaptive ? 2 : 1;
  p.sample_group_draws = sample_group_draws(p.draws_max, p.rows, sm_count);
  p.off_compact_counts = take(size_t{p.compact_passes} * rows * p.compact_blocks * 8);
  p.off_heavy = take(sel * 4);
  p.off_uniq_sorted = take(sel * 4);
  p.off_log_pi = take(sel * 4);
  const bool adaptive = b->heavy == HeavyRule::kAdaptive;
  p.off_sort_keys = take(adaptive ? sel * 4 : 0);
  p.off_sort_keys2 = take(adaptive ? sel * 4 : 0);
  p.off_sort_vals2 = take(adaptive ? sel * 4 : 0);
  p.off_probs = take(adaptive ? sel * 8 : 0);
  p.off_seg_begin = take(rows * 4);
  p.off_seg_end = take(rows * 4);
  p.off_rows = take(rows * sizeof(RowState));
  p.off_partial = take(size_t{p.attn_rows} * p.n_splits * (s.head_dim + 2) * 4);
  // The mixture's per-q-head scores: G times the selection rows' (every item's
  // rows at score_base * G, group_mixture.cu).
  const uint64_t head_floats = mixture && !all_dense ? score * s.group() : 0;
  p.off_head_scores = take(head_floats * 4);
  p.off_head_rows = take(mixture && !all_dense ? size_t{p.attn_rows} * sizeof(RowState) : 0);
  p.off_head_hist = take(mixture && !all_dense ? size_t{p.attn_rows} * kScoreBins * 4 : 0);
  p.off_head_csum = take(head_floats / kChunkTokens * 8);
  p.off_draw_tokens = take(b->record_draws && b->sampling != Sampling::kNone ? sel * 4 : 0);
  p.sort_temp_bytes = adaptive ? segmented_sort_temp_bytes(p.rows, std::max<uint64_t>(sel, 1)) : 0;
  p.off_sort_temp = take(p.sort_temp_bytes);
  p.total_bytes = off;
  *plan = p;
  return cudaSuccess;
}

Workspace bind_workspace(void* base, const WorkspacePlan& p) {
  uint8_t* c = static_cast<uint8_t*>(base);
  Workspace w;
  w.lut = reinterpret_cast<float*>(c + p.off_lut);
  w.lut_range = reinterpret_cast<float*>(c + p.off_lut_range);
  w.scores = reinterpret_cast<float*>(c + p.off_scores);
  w.cut = reinterpret_cast<uint32_t*>(c + p.off_cut);
  w.cut_capacity = p.cut_capacity;
  w.bsum = reinterpret_cast<uint64_t*>(c + p.off_bsum);
  w.csum = reinterpret_cast<uint64_t*>(c + p.off_csum);
  w.cprefix = reinterpret_cast<uint64_t*>(c + p.off_cprefix);
  w.heavy_bits = reinterpret_cast<uint32_t*>(c + p.off_heavy_bits);
  w.sample_bits = reinterpret_cast<uint32_t*>(c + p.off_sample_bits);
  w.hist = reinterpret_cast<uint32_t*>(c + p.off_hist);
  w.compact_counts = reinterpret_cast<uint64_t*>(c + p.off_compact_counts);
  w.compact_blocks = p.compact_blocks;
  w.compact_passes = p.compact_passes;
  w.heavy = reinterpret_cast<uint32_t*>(c + p.off_heavy);
  w.uniq_sorted = reinterpret_cast<uint32_t*>(c + p.off_uniq_sorted);
  w.log_pi = reinterpret_cast<float*>(c + p.off_log_pi);
  w.sort_keys = reinterpret_cast<uint32_t*>(c + p.off_sort_keys);
  w.sort_keys2 = reinterpret_cast<uint32_t*>(c + p.off_sort_keys2);
  w.sort_vals2 = reinterpret_cast<uint32_t*>(c + p.off_sort_vals2);
  w.probs = reinterpret_cast<double*>(c + p.off_probs);
  w.seg_begin = reinterpret_cast<int*>(c + p.off_seg_begin);
  w.seg_end = reinterpret_cast<int*>(c + p.off_seg_end);
  w.rows = reinterpret_cast<RowState*>(c + p.off_rows);
  w.partial = reinterpret_cast<float*>(c + p.off_partial);
  w.head_scores = reinterpret_cast<float*>(c + p.off_head_scores);
  w.head_rows = reinterpret_cast<RowState*>(c + p.off_head_rows);
  w.head_hist = reinterpret_cast<uint32_t*>(c + p.off_head_hist);
  w.head_csum = reinterpret_cast<double*>(c + p.off_head_csum);
  w.draw_tokens = reinterpret_cast<uint32_t*>(c + p.off_draw_tokens);
  w.sort_temp = c + p.off_sort_temp;
  w.sort_temp_bytes = p.sort_temp_bytes;
  return w;
}

cudaError_t run_selection(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                          cudaStream_t st) {
  cudaError_t e = launch_init_rows(b, plan, ws, st);
  if (e != cudaSuccess) return e;
  if (b.proxy != Proxy::kNone) {
    e = b.group == GroupProposal::kMixture ? launch_group_mixture(b, plan, ws, st)
        : b.proxy == Proxy::kPq             ? launch_pq_scores(b, plan, ws, st)
                                            : launch_exact_scores(b, plan, ws, st);
    if (e != cudaSuccess) return e;
    if ((e = launch_topk(b, plan, ws, st)) != cudaSuccess) return e;
    if (b.heavy == HeavyRule::kAdaptive) {
      if ((e = launch_compact(b, plan, ws, false, 0, st)) != cudaSuccess) return e;
      if ((e = launch_adaptive_heavy(b, plan, ws, st)) != cudaSuccess) return e;
    }
    if ((e = launch_sampling(b, plan, ws, st)) != cudaSuccess) return e;
    if ((e = launch_compact(b, plan, ws, b.sampling != Sampling::kNone, plan.compact_passes - 1, st)) !=
        cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

cudaError_t run_shard_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st) {
  const cudaError_t e = launch_init_rows(b, plan, ws, st);
  if (e != cudaSuccess || b.proxy == Proxy::kNone) return e;
  // The mixture's selection rows wait for its heads' global terms.
  if (b.group == GroupProposal::kMixture) return launch_mixture_head_scores(b, plan, ws, st);
  return b.proxy == Proxy::kPq ? launch_pq_scores(b, plan, ws, st) : launch_exact_scores(b, plan, ws, st);
}

cudaError_t run_shard_mixture_norms(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                    cudaStream_t st) {
  return launch_mixture_norms(b, plan, ws, st);
}

cudaError_t run_shard_mixture_terms(const double* csum, uint32_t chunks_stride, const ShardMixtureRow* rows,
                                    uint32_t n_rows, float* terms, cudaStream_t st) {
  return launch_mixture_terms(csum, chunks_stride, rows, n_rows, terms, st);
}

cudaError_t run_shard_mixture_logits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                     const float* terms, const ShardBatchItems& map, cudaStream_t st) {
  return launch_mixture_logits(b, plan, ws, terms, map, st);
}

cudaError_t run_shard_candidate_mass(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                     cudaStream_t st) {
  if (b.heavy != HeavyRule::kAdaptive) return cudaErrorInvalidValue;
  return launch_hierarchy(b, plan, ws, 1, st);
}

cudaError_t run_shard_list_candidates(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                      cudaStream_t st) {
  if (b.heavy != HeavyRule::kAdaptive) return cudaErrorInvalidValue;  // its first of two compactions
  return launch_compact(b, plan, ws, false, 0, st);
}

cudaError_t run_shard_residual(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st) {
  if (b.sampling == Sampling::kNone) return cudaErrorInvalidValue;
  const cudaError_t e = launch_hierarchy(b, plan, ws, 0, st);
  return e != cudaSuccess ? e : launch_chunk_prefix(b, plan, ws, st);
}

cudaError_t run_shard_draws(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t st) {
  return launch_draws(b, plan, ws, st);
}

cudaError_t run_shard_read_sets(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  return launch_compact(b, plan, ws, b.sampling != Sampling::kNone, plan.compact_passes - 1, st);
}

cudaError_t run_split_partials(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st) {
  return launch_split_attention(b, plan, ws, b.proxy == Proxy::kNone, st);
}

cudaError_t run_merge_partials(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st) {
  return launch_merge_splits(b, plan, ws, st);
}

cudaError_t run_attention_stage(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st) {
  return launch_attention(b, plan, ws, b.proxy == Proxy::kNone, st);
}

cudaError_t run_decode(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                       cudaStream_t st) {
  const cudaError_t e = run_selection(b, plan, ws, st);
  return e != cudaSuccess ? e : run_attention_stage(b, plan, ws, st);
}

}  // namespace ssa::cuda
