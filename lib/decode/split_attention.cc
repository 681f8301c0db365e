#include "split_attention.h"

#include <algorithm>

#include "fixed_splits.h"

namespace ssa {
namespace {

// A stable sort of entries by token (tokens < n): least significant digit
// first, 11 bits a pass, as many passes as n needs (two up to 4M tokens).
// std::sort of a 1M-token group's ~80K entries was a tenth of the attention
// stage.
void sort_by_token(std::vector<GroupEntry>* e, uint64_t n) {
  constexpr uint32_t kBits = 11, kBuckets = 1u << kBits;
  thread_local std::vector<GroupEntry> tmp;
  tmp.resize(e->size());
  for (uint32_t shift = 0; shift < 32 && (n - 1) >> shift != 0; shift += kBits) {
    uint32_t count[kBuckets] = {};
    for (const GroupEntry& x : *e) ++count[(x.token >> shift) & (kBuckets - 1)];
    uint32_t run = 0;
    for (uint32_t& c : count) {
      const uint32_t here = c;
      c = run;
      run += here;
    }
    for (const GroupEntry& x : *e) tmp[count[(x.token >> shift) & (kBuckets - 1)]++] = x;
    e->swap(tmp);
  }
}

}  // namespace

void dense_split_partials(const KvLayout& layout, const LayerStore& layer, const float* q, ThreadPool& pool,
                          std::vector<AttnPartial>* parts) {
  const uint32_t d = layout.head_dim, g = layout.group_size();
  const uint64_t n = layer.n_tokens, n_splits = splits_for(n);
  parts->resize(layout.n_kv_heads * n_splits * g);  // every task resets its own
  pool.parallel_for(layout.n_kv_heads * n_splits, [&](size_t task) {
    const uint32_t kv = static_cast<uint32_t>(task / n_splits);
    const uint64_t sp = task % n_splits;
    AttnPartial* mine = &(*parts)[task * g];
    for (uint32_t h = 0; h < g; ++h) mine[h].reset(d);
    attend_range(layout, layer, kv, q + size_t{kv} * g * d, g, sp * kSplitTokens,
                 std::min(n, (sp + 1) * kSplitTokens), mine);
  });
}

void sparse_split_partials(const KvLayout& layout, const LayerStore& layer, uint64_t origin,
                           const DecodePlan& plan, const float* q, const std::vector<Selection>& sels,
                           bool shared, ThreadPool& pool, SplitEntries* scratch, std::vector<AttnPartial>* parts) {
  const uint32_t d = layout.head_dim, g = layout.group_size(), nkv = layout.n_kv_heads;
  const uint64_t n = layer.n_tokens, n_splits = splits_for(n);
  shared = shared && g > 1;
  // The union of a group's selections in token order (then head), and where
  // each split's entries begin.
  std::vector<std::vector<GroupEntry>>& entries = scratch->entries;
  std::vector<std::vector<size_t>>& split_begin = scratch->split_begin;
  entries.resize(nkv);
  split_begin.resize(nkv);
  // Built and sorted in parallel: a group selection at 1M tokens and 50x holds
  // ~80K entries per group.
  pool.parallel_for(nkv, [&](size_t kv) {
    auto& e = entries[kv];
    size_t count = 0;
    for (uint32_t j = 0; j < (shared ? 1 : g); ++j) count += sels[kv * g + j].tokens.size();
    e.clear();
    e.reserve(count);
    for (uint32_t j = 0; j < (shared ? 1 : g); ++j) {
      const Selection& sel = sels[kv * g + j];
      for (size_t r = 0; r < sel.tokens.size(); ++r) e.push_back({sel.tokens[r], j, sel.log_pi[r]});
    }
    // Pushed in head order, so a stable sort by token orders by (token, head).
    sort_by_token(&e, n);
    auto& sb = split_begin[kv];
    sb.resize(n_splits + 1);
    for (uint64_t sp = 0; sp <= n_splits; ++sp) {
      const uint64_t t = std::min(n, sp * kSplitTokens);
      sb[sp] = static_cast<size_t>(
          std::lower_bound(e.begin(), e.end(), t, [](const GroupEntry& x, uint64_t v) { return x.token < v; }) -
          e.begin());
    }
  });
  // The always-read rows in this layer's indices.
  auto clip = [&](uint64_t a, uint64_t b, uint64_t s0, uint64_t s1, uint64_t* c0, uint64_t* c1) {
    *c0 = std::max(a, origin + s0) - origin;
    *c1 = std::min(b, origin + s1);
    *c1 = *c1 > origin ? *c1 - origin : 0;
  };
  parts->resize(nkv * n_splits * g);  // every task resets its own
  pool.parallel_for(nkv * n_splits, [&](size_t task) {
    const uint32_t kv = static_cast<uint32_t>(task / n_splits);
    const uint64_t sp = task % n_splits;
    const uint64_t s0 = sp * kSplitTokens, s1 = std::min(n, s0 + kSplitTokens);
    AttnPartial* mine = &(*parts)[task * g];
    for (uint32_t j = 0; j < g; ++j) mine[j].reset(d);
    const float* qg = q + size_t{kv} * g * d;
    uint64_t c0, c1;
    clip(0, plan.sink_end, s0, s1, &c0, &c1);
    if (c0 < c1) attend_range(layout, layer, kv, qg, g, c0, c1, mine);
    clip(plan.local_begin, plan.n, s0, s1, &c0, &c1);
    if (c0 < c1) attend_range(layout, layer, kv, qg, g, c0, c1, mine);
    const auto& e = entries[kv];
    const size_t b = split_begin[kv][sp], count = split_begin[kv][sp + 1] - b;
    if (count == 0) return;
    if (shared) {
      thread_local std::vector<uint32_t> tokens;
      thread_local std::vector<float> log_pi;
      tokens.resize(count);
      log_pi.resize(count);
      for (size_t r = 0; r < count; ++r) {
        tokens[r] = e[b + r].token;
        log_pi[r] = e[b + r].log_pi;
      }
      attend_shared_rows(layout, layer, kv, qg, g, tokens.data(), log_pi.data(), count, mine);
    } else {
      attend_group_entries(layout, layer, kv, qg, g, e.data() + b, count, mine);
    }
  });
}

void merge_split_partials(const KvLayout& layout, const std::vector<AttnPartial>& parts, uint64_t n_splits,
                          std::vector<AttnPartial>* heads) {
  const uint32_t g = layout.group_size();
  heads->resize(layout.n_q_heads);
  for (uint32_t h = 0; h < layout.n_q_heads; ++h) {
    const uint32_t kv = h / g, j = h % g;
    (*heads)[h].reset(layout.head_dim);
    for (uint64_t sp = 0; sp < n_splits; ++sp) (*heads)[h].merge(parts[(kv * n_splits + sp) * g + j]);
  }
}

}  // namespace ssa
