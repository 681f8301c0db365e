#include "device_state.h"

#include "cuda_backend.h"
#include "device_alloc.h"
#include "device_error.h"
#include "device_guard.h"
#include "kernels/cuda_decode.h"
#include "index/proxy_kind.h"
#include "shard/callback_collective.h"
#include "shard/shard_map.h"

namespace ssa::cuda {

absl::StatusOr<std::shared_ptr<SessionState::Books>> SessionState::device_books(const CodebooksRef& host) {
  auto it = books.find(host.get());
  if (it != books.end()) return it->second;
  forget_unused_books();
  auto b = std::make_shared<Books>();
  b->host = host;
  // As device_books_layout (kernels/pq_index.h) places them: the centroids, then
  // a transformed proxy's key transform and the query side's matrix.
  const std::vector<float>* parts[3] = {&host->data, nullptr, nullptr};
  if (host->rotated()) {
    parts[1] = &host->rotation;
    parts[2] = host->query_transform.empty() ? &host->rotation : &host->query_transform;
  }
  size_t floats = 0;
  for (const std::vector<float>* v : parts) floats += v != nullptr ? v->size() : 0;
  SSA_CUDA_RETURN(b->dev.alloc(floats * sizeof(float), stream), "cudaMallocAsync of codebooks");
  size_t at = 0;
  for (const std::vector<float>* v : parts) {
    if (v == nullptr) continue;
    SSA_CUDA_RETURN(cudaMemcpyAsync(static_cast<float*>(b->dev.p) + at, v->data(), v->size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream),
                    "codebook upload");
    at += v->size();
  }
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "codebook upload");
  // Freed on the legacy default stream: asynchronous appends that encode with
  // them are ordered before it, not before this session's own stream.
  b->dev.stream = nullptr;
  books.emplace(host.get(), b);
  return b;
}

// The device codebooks an append encodes with.
absl::StatusOr<const float*> device_books(SessionState& st, const CodebooksRef& host) {
  absl::MutexLock lock(&st.mu);
  absl::StatusOr<std::shared_ptr<SessionState::Books>> b = st.device_books(host);
  if (!b.ok()) return b.status();
  return static_cast<const float*>((*b)->dev.p);
}

absl::StatusOr<std::shared_ptr<SessionState>> new_state(int device, std::shared_ptr<TieredKvPool> kv,
                                                        std::shared_ptr<DevicePagePool> code) {
  auto st = std::make_shared<SessionState>();
  st->device = device;
  st->kv_pool = std::move(kv);
  st->code_pool = std::move(code);
  int pageable = 0;
  SSA_CUDA_RETURN(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device),
                  "cudaDeviceGetAttribute");
  st->reads_pageable = pageable != 0;
  SSA_CUDA_RETURN(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return st;
}

namespace {

// The tables of pages [p0, p1) of `layer` (the whole layer for an unsharded
// session; tiered only then), a decode through them reading `extent` tokens.
absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> tables_of(const ssa_session& s, SessionState& st,
                                                                    uint32_t layer_index, const LayerStore& layer,
                                                                    size_t p0, size_t p1, uint64_t extent,
                                                                    DecodeItem* item) {
  absl::MutexLock lock(&st.mu);
  if (st.layers.size() < s.layout.n_layers) st.layers.resize(s.layout.n_layers);
  std::shared_ptr<SessionState::LayerCache>& c = st.layers[layer_index];
  const size_t code0 = std::min(p0, layer.code_pages.size()), code1 = std::min(p1, layer.code_pages.size());
  auto same = [](const std::vector<const uint8_t*>& a, const std::vector<PageRef>& b, size_t b0, size_t b1) {
    if (a.size() != b1 - b0) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[b0 + i]->data()) return false;
    return true;
  };
  // Tiered sessions, and sessions with pages mapped from a snapshot file.
  const bool whole = p0 == 0 && p1 == layer.kv_pages.size();
  const bool tiered = st.kv_pool->tiered() || layer_has_host_pages(layer);
  if (tiered && !whole) return internal_error("device tables of part of a tiered layer");
  std::vector<const uint8_t*> entries;
  std::vector<uint8_t> tier_codes;
  std::vector<std::shared_ptr<void>> memory;
  if (tiered) SSA_RETURN_IF_ERROR(tier_view(st, layer_index, layer, &entries, &tier_codes, &memory));
  const bool kv_same = c != nullptr && (tiered ? c->kv == entries : same(c->kv, layer.kv_pages, p0, p1));
  if (!kv_same || !same(c->code, layer.code_pages, code0, code1) || c->books_key != layer.codebooks.get()) {
    st.prune_retired();
    auto fresh = std::make_shared<SessionState::LayerCache>();
    fresh->layer = layer_index;
    if (tiered) {
      fresh->tiered = true;
      fresh->kv = std::move(entries);
      fresh->memory = std::move(memory);
      SSA_RETURN_IF_ERROR(upload_array(fresh->kv.data(), fresh->kv.size() * sizeof(void*), st.stream,
                                       &fresh->kv_table));
      SSA_RETURN_IF_ERROR(upload_array(tier_codes.data(), tier_codes.size(), st.stream, &fresh->tier_table));
      SSA_CUDA_RETURN(fresh->page_rows.alloc(fresh->kv.size() * sizeof(uint32_t), st.stream),
                      "cudaMallocAsync of the tier accounting");
      SSA_CUDA_RETURN(cudaMemsetAsync(fresh->page_rows.p, 0, fresh->kv.size() * sizeof(uint32_t), st.stream),
                      "tier accounting setup");
    } else {
      SSA_RETURN_IF_ERROR(upload_table(layer.kv_pages, false, st.stream, &fresh->kv_table, p0, p1 - p0));
      for (size_t i = p0; i < p1; ++i) {
        fresh->kv.push_back(layer.kv_pages[i]->data());
        fresh->memory.push_back(layer.kv_pages[i]->keeper());
      }
    }
    SSA_RETURN_IF_ERROR(upload_table(layer.code_pages, false, st.stream, &fresh->code_table, code0, code1 - code0));
    for (size_t i = code0; i < code1; ++i) {
      fresh->code.push_back(layer.code_pages[i]->data());
      fresh->memory.push_back(layer.code_pages[i]->keeper());
    }
    fresh->books_key = layer.codebooks.get();
    if (layer.codebooks != nullptr) {
      absl::StatusOr<std::shared_ptr<SessionState::Books>> b = st.device_books(layer.codebooks);
      if (!b.ok()) return b.status();
      fresh->books = *std::move(b);
    }
    // Decodes run on the caller's stream: the uploads must be complete.
    SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "table upload");
    if (c != nullptr) st.retired.push_back(std::move(c));
    c = std::move(fresh);
  }
  item->kv_pages = static_cast<const uint8_t* const*>(c->kv_table.p);
  item->code_pages = static_cast<const uint8_t* const*>(c->code_table.p);
  item->codebooks = c->books != nullptr ? static_cast<const float*>(c->books->dev.p) : nullptr;
  item->query_transform = c->books != nullptr ? device_query_transform(*c->books) : nullptr;
  c->tokens_read = std::max<uint64_t>(c->tokens_read, extent);
  return c;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> layer_tables(const ssa_session& s,
                                                                      uint32_t layer_index,
                                                                      const LayerStore& layer,
                                                                      DecodeItem* item) {
  return tables_of(s, state(s), layer_index, layer, 0, layer.kv_pages.size(), layer.n_tokens, item);
}

absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> layer_tables(const ssa_session& s, SessionState& st,
                                                                      uint32_t layer_index, const LayerStore& layer,
                                                                      size_t page_begin, size_t page_end,
                                                                      uint64_t extent, DecodeItem* item) {
  if (page_begin > page_end || page_end > layer.kv_pages.size())
    return internal_error("device tables of pages ", page_begin, "-", page_end, " of ", layer.kv_pages.size());
  return tables_of(s, st, layer_index, layer, page_begin, page_end, extent, item);
}

// Waits for the session's queued decodes that read more than n_tokens tokens
// (rows an append may rewrite next), and for no other work.
static void truncate_wait(SessionState& st, uint64_t n_tokens);

absl::Status CudaBackend::before_truncate(ssa_session& s, uint64_t n_tokens) const {
  // A shard's decodes read its view, whose tokens count from the shard's first
  // (shard i starts at i * shard_tokens, lib/shard/shard_map.h); a group's rank
  // holds one shard, its rank's.
  const uint32_t first_shard = s.rt->group != nullptr ? s.rt->group->rank() : 0;
  for (uint32_t i = 0; i < shard_count(s); ++i) {
    const uint64_t begin = shard_begin(first_shard + i, s.rt->shard_tokens, n_tokens);
    truncate_wait(shard_state(s, i), n_tokens - begin);
  }
  return absl::OkStatus();
}

static void truncate_wait(SessionState& st, uint64_t n_tokens) {
  absl::MutexLock lock(&st.mu);
  st.prune_retired();
  auto wait = [&](SessionState::LayerCache& c) {
    if (c.tokens_read <= n_tokens) return;
    c.last_use.wait();
    c.tokens_read = n_tokens;  // decodes still queued read no more than this
  };
  for (const auto& c : st.layers)
    if (c != nullptr) wait(*c);
  for (const auto& c : st.retired) wait(*c);
}

PqIndexShape index_shape(const KvLayout& L, ssa_proxy proxy) {
  PqIndexShape s;
  s.code_bits = L.code_bits;
  s.key_transform = proxy_has_transform(proxy);
  s.n_kv_heads = L.n_kv_heads;
  s.head_dim = L.head_dim;
  s.subspaces = L.pq_subspaces;
  s.centroids = L.pq_centroids;
  s.page_tokens = L.page_tokens;
  s.page_shift = 0;
  while ((1u << s.page_shift) < L.page_tokens) ++s.page_shift;
  s.dtype = L.dtype;
  return s;
}

DecodeShape decode_shape(const KvLayout& L) {
  DecodeShape s;
  s.n_q_heads = L.n_q_heads;
  s.n_kv_heads = L.n_kv_heads;
  s.head_dim = L.head_dim;
  s.page_tokens = L.page_tokens;
  s.page_shift = index_shape(L, SSA_PROXY_PQ).page_shift;
  s.pq_subspaces = L.pq_subspaces;
  s.pq_centroids = L.pq_centroids;
  s.pq_code_bits = L.code_bits;
  s.dtype = L.dtype;
  return s;
}

absl::Status CudaBackend::init_session(ssa_session& s) const {
  // Every proxy runs on one device (transforms in the device encoder and lookup
  // tables, 4-bit codes in pq4_score_kernel); the sharded paths train, encode and
  // score untransformed 8-bit codes only.
  if (s.config.proxy != SSA_PROXY_PQ && (s.rt->devices.size() > 1 || s.rt->group != nullptr)) {
    return unsupported("CUDA sessions: proxy ", static_cast<int>(s.config.proxy),
                       " on a runtime of several devices or processes (sharded CUDA sessions use SSA_PROXY_PQ)");
  }
  // The device trains and encodes with squared error only.
  if (s.config.pq_parallel_weight > 1.0f) {
    return unsupported("CUDA sessions: pq_parallel_weight ", s.config.pq_parallel_weight,
                       " (score-aware codebooks are trained and encoded on the CPU backend only; use 1)");
  }
  const char* why = unsupported_shape(decode_shape(s.layout), true);
  if (why != nullptr) return unsupported("CUDA sessions: ", why);
  if (s.layout.head_dim / s.layout.pq_subspaces > 64) {
    return unsupported("CUDA sessions: PQ sub-vectors of more than 64 elements");
  }
  const size_t kv_bytes = s.layout.kv_page_bytes();
  const std::shared_ptr<DeviceBudget>& budget = s.rt->budget;
  // One state per shard, each with its device's pools (a runtime of one device: one).
  std::vector<std::shared_ptr<SessionState>> shards;
  for (const int32_t device : s.rt->devices) {
    const DeviceGuard on(device);
    SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
    // Under a limited budget the runtime's sessions share their K/V page blocks.
    std::shared_ptr<DevicePagePool> kv_blocks = s.rt->shared_pages != nullptr && s.rt->group == nullptr
                                                    ? s.rt->shared_pages->get(kv_bytes, device)
                                                    : DevicePagePool::create(kv_bytes, 64, device);
    auto kv = std::make_shared<TieredKvPool>(std::move(kv_blocks),
                                             budget->limited() ? PinnedPagePool::create(kv_bytes, s.rt->host_pool) : nullptr,
                                             budget, kv_bytes);
    absl::StatusOr<std::shared_ptr<SessionState>> st =
        new_state(device, std::move(kv), DevicePagePool::create(s.layout.code_page_bytes(), 64, device));
    if (!st.ok()) return st.status();
    if (budget->limited()) {
      (*st)->cache_pages_per_layer = budget->limit(DeviceBudget::kCache) / kv_bytes / s.layout.n_layers;
    }
    shards.push_back(*std::move(st));
  }
  shards[0]->other_shards.assign(shards.begin() + 1, shards.end());
  SSA_CUDA_RETURN(cudaSetDevice(s.rt->device), "cudaSetDevice");
  s.backend_state = std::move(shards[0]);
  if (s.rt->budget_peers != nullptr && s.rt->group == nullptr) s.rt->budget_peers->join(&s);
  return absl::OkStatus();
}

absl::Status CudaBackend::init_fork(const ssa_session& from, ssa_session& fork) const {
  std::vector<std::shared_ptr<SessionState>> shards;
  for (uint32_t i = 0; i < shard_count(from); ++i) {
    const SessionState& st = shard_state(from, i);
    const DeviceGuard on(st.device);
    SSA_CUDA_RETURN(on.error(), "cudaSetDevice");
    absl::StatusOr<std::shared_ptr<SessionState>> f = new_state(st.device, st.kv_pool, st.code_pool);
    if (!f.ok()) return f.status();
    (*f)->cache_pages_per_layer = st.cache_pages_per_layer;
    shards.push_back(*std::move(f));
  }
  shards[0]->other_shards.assign(shards.begin() + 1, shards.end());
  SSA_CUDA_RETURN(cudaSetDevice(state(from).device), "cudaSetDevice");
  fork.backend_state = std::move(shards[0]);
  if (fork.rt->budget_peers != nullptr && fork.rt->group == nullptr) fork.rt->budget_peers->join(&fork);
  return absl::OkStatus();
}

void CudaBackend::session_destroyed(int device) const {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  // The destroyed session's memory was freed on the legacy default stream (after
  // any asynchronous append it queued); a trim gives back only frees that have
  // completed: what the library's pool keeps unused goes back to the driver.
  if (cudaStreamSynchronize(nullptr) != cudaSuccess) cudaGetLastError();
  device_pool_trim();
  if (cudaSetDevice(current) != cudaSuccess) cudaGetLastError();
}

}  // namespace ssa::cuda
