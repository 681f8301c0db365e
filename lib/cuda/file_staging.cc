#include "file_staging.h"

#include <string.h>

#include <algorithm>

#include "device_error.h"
#include "device_tiers.h"
#include "kernels/file_rows.h"
#include "kernels/tier_accounting.h"
#include "pinned_pages.h"
#include "runtime.h"
#include "status.h"

namespace ssa::cuda {
namespace {

// A page of the item's layer read from its file mapping (not from a cached copy).
bool staged_page(const FileStageItem& it, size_t j) {
  const Page& p = *it.layer->kv_pages[j];
  return p.tier() == PageTier::kFile && it.tables->kv[j] == p.data();
}

bool marked(const std::vector<uint32_t>& bits, size_t base, uint64_t bit) {
  return (bits[base + bit / 32] >> (bit % 32)) & 1u;
}

// Whether any of bits [lo, hi) is set, a word at a time.
bool any_marked(const std::vector<uint32_t>& bits, size_t base, uint64_t lo, uint64_t hi) {
  while (lo < hi && lo % 32 != 0)
    if (marked(bits, base, lo++)) return true;
  for (; lo + 32 <= hi; lo += 32)
    if (bits[base + lo / 32] != 0) return true;
  for (; lo < hi; ++lo)
    if (marked(bits, base, lo)) return true;
  return false;
}

// The rows of file page j that are marked (all with `whole`), copied into dst at
// their places: runs of consecutive slots of one KV head in one copy each.
uint64_t copy_rows(const KvLayout& L, const uint8_t* src, uint8_t* dst, size_t j, uint64_t n_tokens,
                   const std::vector<uint32_t>& bits, size_t base, bool whole) {
  const uint32_t P = L.page_tokens;
  const uint64_t t0 = uint64_t{j} * P;
  const uint32_t slots = static_cast<uint32_t>(std::min<uint64_t>(P, n_tokens - t0));
  if (whole) {
    memcpy(dst, src, L.kv_page_bytes());
    return uint64_t{slots} * L.n_kv_heads;
  }
  const size_t row = L.row_bytes();
  uint64_t rows = 0;
  for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
    for (uint32_t a = 0; a < slots;) {
      if (!marked(bits, base, (t0 + a) * L.n_kv_heads + h)) {
        ++a;
        continue;
      }
      uint32_t e = a + 1;
      while (e < slots && marked(bits, base, (t0 + e) * L.n_kv_heads + h)) ++e;
      memcpy(dst + L.k_offset(h, a), src + L.k_offset(h, a), (e - a) * row);
      memcpy(dst + L.v_offset(h, a), src + L.v_offset(h, a), (e - a) * row);
      rows += e - a;
      a = e;
    }
  }
  return rows;
}

// The session's pool of pinned pages for staged rows, made on first use.
absl::StatusOr<std::shared_ptr<PinnedPagePool>> stage_pool(const ssa_session& s) {
  SessionState& st = state(s);
  absl::MutexLock lock(&st.mu);
  if (st.file_stage_pool == nullptr) st.file_stage_pool = PinnedPagePool::create(s.layout.kv_page_bytes(), s.rt->host_pool);
  return st.file_stage_pool;
}

}  // namespace

bool stages_file_rows(const ssa_session& s, const LayerStore& layer) {
  return !state(s).reads_pageable && layer_has_file_pages(layer);
}

absl::Status stage_file_rows(const std::vector<FileStageItem>& items, DecodeBatch* b, const Workspace* ws,
                             cudaStream_t stream, FileStage* out) {
  if (items.empty()) return absl::OkStatus();
  const KvLayout& L = items[0].s->layout;
  const bool whole = ws == nullptr;
  // Marks: one bit per (token, KV head) of each item's layer, read back whole.
  std::vector<size_t> base(items.size(), 0);
  std::vector<uint32_t> bits;
  if (!whole) {
    size_t words = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      base[i] = words;
      words += (uint64_t{items[i].layer->n_tokens} * L.n_kv_heads + 31) / 32;
    }
    SSA_CUDA_RETURN(out->bits.alloc(words * sizeof(uint32_t), stream), "cudaMallocAsync of the file-row marks");
    SSA_CUDA_RETURN(cudaMemsetAsync(out->bits.p, 0, words * sizeof(uint32_t), stream), "file-row marks");
    FileRowBatch m{};
    for (size_t i = 0; i < items.size(); ++i) {
      m.items[items[i].item].page_tier = static_cast<const uint8_t*>(items[i].tables->tier_table.p);
      m.items[items[i].item].bits = static_cast<uint32_t*>(out->bits.p) + base[i];
    }
    SSA_CUDA_RETURN(launch_mark_file_rows(*b, *ws, m, stream), "file-row marking kernel");
    bits.resize(words);
    SSA_CUDA_RETURN(cudaMemcpyAsync(bits.data(), out->bits.p, words * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                    stream),
                    "file-row marks read-back");
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "file-row marks read-back");
  }
  struct Copy {
    size_t item, page;
    uint8_t* dst;
  };
  std::vector<Copy> copies;
  std::vector<std::vector<const uint8_t*>> entries(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const FileStageItem& it = items[i];
    absl::StatusOr<std::shared_ptr<PinnedPagePool>> pool = stage_pool(*it.s);
    if (!pool.ok()) return pool.status();
    entries[i] = it.tables->kv;
    const uint64_t n = it.layer->n_tokens;
    for (size_t j = 0; j < entries[i].size(); ++j) {
      if (!staged_page(it, j)) continue;
      const uint64_t t0 = uint64_t{j} * L.page_tokens, t1 = std::min<uint64_t>(n, t0 + L.page_tokens);
      // No read set takes a row of it: the attention does not read it.
      if (!whole && !any_marked(bits, base[i], t0 * L.n_kv_heads, t1 * L.n_kv_heads)) continue;
      absl::StatusOr<PageRef> page = (*pool)->allocate();
      if (!page.ok()) return page.status();
      copies.push_back({i, j, (*page)->mutable_data()});
      entries[i][j] = (*page)->data();
      out->pinned.push_back(*std::move(page));
    }
  }
  std::vector<uint64_t> rows(copies.size(), 0);
  auto run = [&](size_t c) {
    const Copy& k = copies[c];
    const FileStageItem& it = items[k.item];
    rows[c] = copy_rows(L, it.layer->kv_pages[k.page]->data(), k.dst, k.page, it.layer->n_tokens, bits,
                        base[k.item], whole);
  };
  items[0].s->rt->pool->parallel_for(copies.size(), run);
  for (uint64_t r : rows) out->rows_copied += r;
  std::vector<DeviceMem*> made;
  for (size_t i = 0; i < items.size(); ++i) {
    auto t = std::make_unique<DeviceMem>();
    SSA_RETURN_IF_ERROR(upload_array(entries[i].data(), entries[i].size() * sizeof(void*), stream, t.get()));
    made.push_back(t.get());
    out->tables.push_back(std::move(t));
  }
  for (size_t i = 0; i < items.size(); ++i)
    b->items[items[i].item].kv_pages = static_cast<const uint8_t* const*>(made[i]->p);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PageRef>> readable_pages(const ssa_session& s, const LayerStore& layer) {
  std::vector<PageRef> pages = layer.kv_pages;
  if (state(s).reads_pageable) return pages;
  std::vector<size_t> staged;
  for (size_t j = 0; j < pages.size(); ++j)
    if (pages[j]->tier() == PageTier::kFile) staged.push_back(j);
  if (staged.empty()) return pages;
  absl::StatusOr<std::shared_ptr<PinnedPagePool>> pool = stage_pool(s);
  if (!pool.ok()) return pool.status();
  std::vector<PageRef> copies;
  for (size_t k = 0; k < staged.size(); ++k) {
    absl::StatusOr<PageRef> page = (*pool)->allocate();
    if (!page.ok()) return page.status();
    copies.push_back(*std::move(page));
  }
  const size_t bytes = s.layout.kv_page_bytes();
  auto run = [&](size_t k) { memcpy(copies[k]->mutable_data(), pages[staged[k]]->data(), bytes); };
  s.rt->pool->parallel_for(staged.size(), run);
  for (size_t k = 0; k < staged.size(); ++k) pages[staged[k]] = std::move(copies[k]);
  return pages;
}

}  // namespace ssa::cuda
