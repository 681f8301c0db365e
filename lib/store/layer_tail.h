// The pages an append writes, gathered aside so that the layer itself changes
// only at the commit, when nothing can fail any more: the partly filled last page
// (copied first if shared: copy-on-write) and the new pages after it. An append
// then costs O(its own tokens), where copying the layer's page lists to stay
// all-or-nothing would make it O(pages).
// Host (PagePool), device (DevicePagePool) and tiered (TieredKvPool) pages alike.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "copy_on_write.h"
#include "held_range.h"
#include "kv_layout.h"
#include "layer_store.h"
#include "status.h"

namespace ssa {

struct LayerTail {
  uint64_t first_page = 0;          // the layer's index of kv[0] and code[0]
  std::vector<PageRef> kv, code;    // the layer's pages from first_page on, after the append
  uint64_t new_n = 0;

  Page& kv_page(uint64_t index) { return *kv[index - first_page]; }
};

// The tail of `layer` growing to new_n tokens. code_pool: null when the layer has
// no codes. Also reserves room in the layer's page lists (geometrically), so that
// commit_tail cannot fail; that changes no content. Pages outside `held` are
// neither allocated nor copied: their slots stay null (a rank of a group keeps
// its shard only).
template <typename KvPool, typename CodePool>
absl::Status gather_tail(LayerStore& layer, const KvLayout& L, uint64_t new_n, KvPool& kv_pool,
                         CodePool* code_pool, LayerTail* t, const HeldRange& held = HeldRange{}) {
  const uint32_t P = L.page_tokens;
  const uint64_t old_n = layer.n_tokens, need = L.pages_for(new_n);
  auto reserve = [&](std::vector<PageRef>& v) {
    if (v.capacity() < need) v.reserve(std::max<uint64_t>(need, 2 * v.capacity()));
  };
  reserve(layer.kv_pages);
  if (code_pool != nullptr) reserve(layer.code_pages);
  t->first_page = old_n / P;
  t->new_n = new_n;
  t->kv.reserve(need - t->first_page);
  if (code_pool != nullptr) t->code.reserve(need - t->first_page);
  if (old_n % P != 0 && !held.holds_page(t->first_page, P)) {
    t->kv.emplace_back();
    if (code_pool != nullptr) t->code.emplace_back();
  } else if (old_n % P != 0) {
    // Rows go into the last page beyond the visible length: it must be ours
    // alone (the layer and the tail hold the two expected references).
    t->kv.push_back(layer.kv_pages.back());
    SSA_RETURN_IF_ERROR(make_writable(kv_pool, t->kv.back(), 2));
    if (code_pool != nullptr) {
      t->code.push_back(layer.code_pages.back());
      SSA_RETURN_IF_ERROR(make_writable(*code_pool, t->code.back(), 2));
    }
  }
  while (t->first_page + t->kv.size() < need) {
    if (!held.holds_page(t->first_page + t->kv.size(), P)) {
      t->kv.emplace_back();
      continue;
    }
    auto page = kv_pool.allocate();
    if (!page.ok()) return page.status();
    t->kv.push_back(*std::move(page));
  }
  while (code_pool != nullptr && t->first_page + t->code.size() < need) {
    if (!held.holds_page(t->first_page + t->code.size(), P)) {
      t->code.emplace_back();
      continue;
    }
    auto page = code_pool->allocate();
    if (!page.ok()) return page.status();
    t->code.push_back(*std::move(page));
  }
  return absl::OkStatus();
}

// Puts the tail into the layer (its lists were reserved by gather_tail).
inline void commit_tail(LayerTail&& t, LayerStore* layer) {
  auto put = [&](std::vector<PageRef>& dst, std::vector<PageRef>& src) {
    dst.resize(t.first_page);
    for (PageRef& p : src) dst.push_back(std::move(p));
  };
  put(layer->kv_pages, t.kv);
  if (!t.code.empty()) put(layer->code_pages, t.code);
  layer->n_tokens = t.new_n;
}

}  // namespace ssa
