// The CUDA decode's workspace planner (plan_workspace) is host code: these checks
// run without a GPU. Every buffer of a decode is carved from one allocation, so a
// buffer sized too small would silently overlap its neighbour on the device; here
// each region's extent is checked against what the kernels index, for batches of
// mixed lengths (dense items inside a sparse batch included), several shapes and
// every group selection (selection rows per KV head, the mixture's scratch rows
// per q head).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/sampling_hierarchy.h"
#include "kernels/cuda_decode.h"

namespace ssa::gputest {
namespace {

using cuda::DecodeBatch;
using cuda::DecodeItem;
using cuda::WorkspacePlan;

struct Shape {
  uint32_t nq, nkv, d;
  DType dtype;
};

// An item of n tokens with sink/local of 64 each and a budget of n / sparsity
// (sparsity 0: dense item).
DecodeItem item(uint32_t n, uint32_t sparsity) {
  DecodeItem it;
  it.n_tokens = n;
  if (sparsity == 0 || n < 1024) {
    it.sink_end = it.local_begin = n;
    return it;
  }
  it.sink_end = 64;
  it.local_begin = n - 64;
  it.n_select = n / sparsity;
  it.n_heavy = it.n_select * 2 / 5;
  return it;
}

// A buffer: [off, off + bytes) must end at or before the next buffer's offset.
struct Region {
  const char* name;
  size_t off, bytes;
};

WorkspacePlan check_plan(const Shape& sh, cuda::Proxy proxy, cuda::HeavyRule heavy,
                         const std::vector<DecodeItem>& items, int sm_count,
                         cuda::GroupProposal group = cuda::GroupProposal::kOff) {
  DecodeBatch b;
  b.shape.n_q_heads = sh.nq;
  b.shape.n_kv_heads = sh.nkv;
  b.shape.head_dim = sh.d;
  b.shape.page_tokens = 256;
  b.shape.page_shift = 8;
  b.shape.pq_subspaces = 16;
  b.shape.pq_centroids = 256;
  b.shape.dtype = sh.dtype;
  b.proxy = proxy;
  b.heavy = heavy;
  b.sampling = cuda::Sampling::kProxy;
  b.group = group;
  b.n_items = static_cast<uint32_t>(items.size());
  for (size_t i = 0; i < items.size(); ++i) b.items[i] = items[i];
  WorkspacePlan p;
  REQUIRE(cuda::plan_workspace(&b, sm_count, &p) == cudaSuccess);
  const bool all_dense = proxy == cuda::Proxy::kNone;
  const bool mixture = group == cuda::GroupProposal::kMixture;
  // Selection rows per item: q heads, or KV heads with group selection.
  const uint32_t ns = group == cuda::GroupProposal::kOff ? sh.nq : sh.nkv;
  CHECK(b.sel_heads() == ns);
  INFO("nq ", sh.nq, " nkv ", sh.nkv, " d ", sh.d, " items ", items.size(), " dense ", all_dense, " group ",
       static_cast<int>(group));

  // Per item: rows placed one after another, whole chunks, room for the selection.
  uint64_t score = 0, sel = 0;
  uint32_t n_pad_max = 0;
  for (uint32_t i = 0; i < b.n_items; ++i) {
    const DecodeItem& it = b.items[i];
    CHECK(it.n_pad % kChunkTokens == 0);
    const bool dense = it.sink_end >= it.local_begin;
    if (!dense) CHECK(it.n_pad >= it.n_tokens);
    CHECK(it.score_base == score);
    CHECK(it.select_base == sel);
    CHECK(it.select_cap >= std::max(it.n_select, 1u));
    score += uint64_t{ns} * it.n_pad;
    sel += uint64_t{ns} * it.select_cap;
    n_pad_max = std::max(n_pad_max, it.n_pad);
  }
  CHECK(p.n_pad_max == n_pad_max);
  CHECK(p.rows == b.n_items * ns);
  CHECK(p.attn_rows == b.n_items * sh.nq);
  CHECK(p.n_splits >= 1);
  CHECK(p.n_splits <= cuda::kMaxSplits);
  if (all_dense) return p;
  CHECK(p.score_floats == score);
  CHECK(p.select_entries == sel);
  // Launch geometry the kernels rely on.
  CHECK(p.scan_blocks >= 1);
  CHECK(p.scan_blocks <= 64);
  CHECK(p.score_tile >= 1024);
  CHECK(p.score_tile % 1024 == 0);
  CHECK(p.compact_blocks >= 1);
  CHECK(p.compact_blocks <= cuda::kMaxCompactBlocks);
  CHECK(uint64_t{p.compact_blocks} * p.compact_words * 32 >= n_pad_max);  // every bitmap word covered
  CHECK(p.compact_words % 256 == 0);                                        // whole words per thread
  // Boundary-bin lists: at least what refine stages whole, never past a row.
  CHECK(p.cut_capacity >= std::min(n_pad_max, cuda::kCutListMin));
  CHECK(p.cut_capacity <= n_pad_max);

  const size_t rows = p.rows, qrows = p.attn_rows;
  const bool adaptive = heavy == cuda::HeavyRule::kAdaptive;
  // The mixture scores every q head with its own table, into scratch rows G times
  // the selection rows (group_mixture.cu).
  const size_t lut_rows = mixture ? qrows : rows;
  const uint64_t head_floats = mixture ? score * (sh.nq / sh.nkv) : 0;
  std::vector<Region> r = {
      {"lut", p.off_lut, proxy == cuda::Proxy::kPq ? lut_rows * 16 * 256 * 4 : 0},
      {"lut_range", p.off_lut_range, proxy == cuda::Proxy::kPq ? lut_rows * 16 * 2 * 4 : 0},
      {"scores", p.off_scores, score * 4},
      {"cut", p.off_cut, rows * p.cut_capacity * 4},
      {"bsum", p.off_bsum, score / kBlockTokens * 8},
      {"csum", p.off_csum, score / kChunkTokens * 8},
      {"cprefix", p.off_cprefix, score / kChunkTokens * 8},
      {"heavy_bits", p.off_heavy_bits, score / 32 * 4},
      {"sample_bits", p.off_sample_bits, score / 32 * 4},
      {"hist", p.off_hist, rows * cuda::kScoreBins * 4},
      {"compact_counts", p.off_compact_counts, (adaptive ? 2 : 1) * rows * p.compact_blocks * 8},
      {"heavy", p.off_heavy, sel * 4},
      {"uniq_sorted", p.off_uniq_sorted, sel * 4},
      {"log_pi", p.off_log_pi, sel * 4},
      {"sort_keys", p.off_sort_keys, adaptive ? sel * 4 : 0},
      {"sort_keys2", p.off_sort_keys2, adaptive ? sel * 4 : 0},
      {"sort_vals2", p.off_sort_vals2, adaptive ? sel * 4 : 0},
      {"probs", p.off_probs, adaptive ? sel * 8 : 0},
      {"seg_begin", p.off_seg_begin, rows * 4},
      {"seg_end", p.off_seg_end, rows * 4},
      {"rows", p.off_rows, rows * sizeof(cuda::RowState)},
      {"partial", p.off_partial, qrows * p.n_splits * (sh.d + 2) * 4},
      {"head_scores", p.off_head_scores, head_floats * 4},
      {"head_rows", p.off_head_rows, mixture ? qrows * sizeof(cuda::RowState) : 0},
      {"head_hist", p.off_head_hist, mixture ? qrows * cuda::kScoreBins * 4 : 0},
      {"head_csum", p.off_head_csum, head_floats / kChunkTokens * 8},
      {"sort_temp", p.off_sort_temp, p.sort_temp_bytes},
  };
  // Listed in allocation order.
  for (size_t i = 0; i < r.size(); ++i) {
    INFO("region ", std::string(r[i].name));
    CHECK(r[i].off % 256 == 0);
    const size_t end = i + 1 < r.size() ? r[i + 1].off : p.total_bytes;
    CHECK(r[i].off + r[i].bytes <= end);
  }
  return p;
}

TEST_CASE("CUDA workspace plan: every buffer fits, for mixed batches and shapes (host only)") {
  const Shape shapes[] = {{16, 4, 256, DType::kF16}, {32, 8, 128, DType::kBF16}, {8, 8, 64, DType::kF32},
                          {16, 1, 128, DType::kF16}};
  for (const Shape& sh : shapes) {
    for (int sms : {1, 132}) {
      // One long sparse item; a mixed batch with a dense item and odd lengths.
      check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kFixed, {item(1u << 20, 50)}, sms);
      check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kAdaptive,
                 {item(70001, 20), item(3000, 0), item(131072, 10), item(5000, 100)}, sms);
      check_plan(sh, cuda::Proxy::kExact, cuda::HeavyRule::kFixed, {item(40000, 50), item(2049, 2)}, sms);
      check_plan(sh, cuda::Proxy::kNone, cuda::HeavyRule::kFixed, {item(1u << 20, 0), item(777, 0)}, sms);
    }
  }
  // More bitmap words than kMaxCompactBlocks blocks of 4 words a thread cover.
  check_plan({16, 4, 256, DType::kF16}, cuda::Proxy::kPq, cuda::HeavyRule::kFixed, {item(12u << 20, 100)}, 132);
}

TEST_CASE("CUDA workspace plan: group selection keeps one selection row per KV head (host only)") {
  using cuda::GroupProposal;
  const Shape shapes[] = {{16, 4, 256, DType::kF16}, {32, 8, 128, DType::kBF16}, {8, 8, 64, DType::kF32},
                          {16, 1, 128, DType::kF16}};
  for (const Shape& sh : shapes) {
    for (GroupProposal g : {GroupProposal::kMeanQuery, GroupProposal::kMixture}) {
      for (int sms : {1, 132}) {
        check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kFixed, {item(1u << 20, 50)}, sms, g);
        check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kAdaptive,
                   {item(70001, 20), item(3000, 0), item(131072, 10), item(5000, 100)}, sms, g);
        check_plan(sh, cuda::Proxy::kExact, cuda::HeavyRule::kFixed, {item(40000, 50), item(2049, 2)}, sms, g);
      }
    }
    // The selection buffers shrink by the group size against per-head selection;
    // the attention's partials do not.
    const std::vector<DecodeItem> items = {item(70001, 20), item(131072, 10)};
    const WorkspacePlan off = check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kFixed, items, 132);
    const WorkspacePlan mean =
        check_plan(sh, cuda::Proxy::kPq, cuda::HeavyRule::kFixed, items, 132, GroupProposal::kMeanQuery);
    const uint32_t G = sh.nq / sh.nkv;
    INFO("nq ", sh.nq, " nkv ", sh.nkv);
    CHECK(off.rows == G * mean.rows);
    CHECK(off.score_floats == G * mean.score_floats);
    CHECK(off.attn_rows == mean.attn_rows);
    if (G > 1) CHECK(mean.total_bytes < off.total_bytes);
    if (G == 1) CHECK(mean.total_bytes == off.total_bytes);
  }
}

}  // namespace
}  // namespace ssa::gputest
