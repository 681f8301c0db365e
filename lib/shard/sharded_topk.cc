#include "sharded_topk.h"

#include <algorithm>
#include <utility>

#include "select/radix_topk.h"
#include "status.h"

namespace ssa {

absl::Status sharded_topk(Collective& comm, ThreadPool& pool, const std::vector<TopkUnit>& units,
                          std::vector<std::vector<uint32_t>>* out) {
  const size_t U = units.size();
  out->assign(U, {});
  // Units that need no threshold: none wanted, or all of them.
  std::vector<uint8_t> active(U, 0);
  for (size_t u = 0; u < U; ++u) {
    if (units[u].k >= units[u].n_global) {
      for (size_t i = 0; i < units[u].n; ++i) (*out)[u].push_back(static_cast<uint32_t>(i));
    }
    active[u] = units[u].k > 0 && units[u].k < units[u].n_global;
  }
  std::vector<uint32_t> prefix(U, 0);
  std::vector<uint64_t> need(U);
  for (size_t u = 0; u < U; ++u) need[u] = units[u].k;
  // Two passes over this shard's candidates, as topk_indices makes: the first
  // round's histogram, then one pass that takes every candidate above the
  // threshold's top bin and keeps those in it (the border, in index order);
  // the later rounds and the ties look at the border only.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> border(U);  // (key, index)
  std::vector<uint64_t> hist;
  for (int level = 0; level < kShardedTopkRounds; ++level) {
    const int shift = sharded_topk_shift(level), bits = sharded_topk_bits(level);
    const size_t bins = size_t{1} << bits;
    hist.assign(U * bins, 0);
    pool.parallel_for(U, [&](size_t u) {
      if (!active[u]) return;
      uint64_t* h = hist.data() + u * bins;
      if (level == 0) {
        // Four copies in turn: scores crowd into few bins, and consecutive
        // increments of one counter would wait on each other's stores.
        const float* x = units[u].x;
        const size_t n = units[u].n;
        std::vector<uint32_t> c(4 * bins, 0);
        size_t i = 0;
        for (; i + 4 <= n; i += 4) {
          ++c[float_order_key(x[i]) >> shift];
          ++c[bins + (float_order_key(x[i + 1]) >> shift)];
          ++c[2 * bins + (float_order_key(x[i + 2]) >> shift)];
          ++c[3 * bins + (float_order_key(x[i + 3]) >> shift)];
        }
        for (; i < n; ++i) ++c[float_order_key(x[i]) >> shift];
        for (size_t b = 0; b < bins; ++b) h[b] = uint64_t{c[b]} + c[bins + b] + c[2 * bins + b] + c[3 * bins + b];
        return;
      }
      const int above_shift = shift + bits;
      for (const auto& [key, i] : border[u]) {
        if ((key >> above_shift) != prefix[u]) continue;
        ++h[(key >> shift) & (bins - 1)];
      }
    });
    SSA_RETURN_IF_ERROR(comm.all_reduce_sum(hist.data(), hist.size()));
    for (size_t u = 0; u < U; ++u) {
      if (!active[u]) continue;
      const uint64_t* h = hist.data() + u * bins;
      uint64_t above = 0;
      size_t bin = bins - 1;
      for (; bin > 0 && above + h[bin] < need[u]; --bin) above += h[bin];
      need[u] -= above;
      prefix[u] = (prefix[u] << bits) | static_cast<uint32_t>(bin);
    }
    if (level != 0) continue;
    pool.parallel_for(U, [&](size_t u) {
      if (!active[u]) return;
      auto& o = (*out)[u];
      for (size_t i = 0; i < units[u].n; ++i) {
        const uint32_t key = float_order_key(units[u].x[i]);
        const uint32_t b = key >> shift;
        if (b > prefix[u]) {
          o.push_back(static_cast<uint32_t>(i));
        } else if (b == prefix[u]) {
          border[u].emplace_back(key, static_cast<uint32_t>(i));
        }
      }
    });
  }
  // prefix[u] is the k-th largest key; need[u] of the keys equal to it are taken.
  std::vector<uint64_t> ties(U, 0);
  for (size_t u = 0; u < U; ++u) {
    if (!active[u]) continue;
    for (const auto& e : border[u]) ties[u] += e.first == prefix[u];
  }
  std::vector<uint64_t> all_ties(size_t{comm.size()} * U);
  SSA_RETURN_IF_ERROR(comm.all_gather(ties.data(), U * sizeof(uint64_t), all_ties.data()));
  pool.parallel_for(U, [&](size_t u) {
    if (!active[u]) return;
    uint64_t before = 0;
    for (uint32_t r = 0; r < comm.rank(); ++r) before += all_ties[r * U + u];
    uint64_t take = need[u] > before ? need[u] - before : 0;
    auto& o = (*out)[u];
    for (const auto& [key, i] : border[u]) {
      if (key > prefix[u]) {
        o.push_back(i);
      } else if (key == prefix[u] && take > 0) {
        o.push_back(i);
        --take;
      }
    }
    std::sort(o.begin(), o.end());
  });
  return absl::OkStatus();
}

}  // namespace ssa
