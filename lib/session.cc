#include "session.h"

#include <string.h>

#include <algorithm>

#include "cuda/cuda_backend.h"
#include "index/pq_index.h"
#include "status.h"
#include "versioned_struct.h"
#include "store/layer_tail.h"

namespace ssa {
namespace {

bool is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Trains codebooks on `layer` and re-encodes all its codes; commits into `layer`
// only when everything succeeded.
absl::Status retrain_layer(ssa_session& s, LayerStore& layer) {
  if (s.cuda != nullptr) return cuda::retrain_layer(s, layer);  // CUDA backend hook
  absl::StatusOr<CodebooksRef> books =
      train_codebooks(s.layout, layer, s.config.index_train_sample, s.config.index_iterations,
                      *s.rt->pool);
  if (!books.ok()) return books.status();
  absl::StatusOr<std::vector<PageRef>> codes =
      encode_layer(s.layout, *books, layer, *s.code_pool, *s.rt->pool);
  if (!codes.ok()) return codes.status();
  layer.codebooks = *std::move(books);
  layer.code_pages = *std::move(codes);
  layer.trained_at_tokens = layer.n_tokens;
  return absl::OkStatus();
}

}  // namespace

absl::Status validate_session_config(const ssa_session_config& c, KvLayout* layout) {
  // c is a whole struct of this header (read_struct at the ABI, or a snapshot's
  // decoded config): its struct_size was checked where it was read.
  if (c.n_layers == 0 || c.n_layers > 65536) {
    return invalid_argument("n_layers ", c.n_layers, " must be in 1..65536");
  }
  if (c.n_kv_heads == 0 || c.n_kv_heads > 1024) {
    return invalid_argument("n_kv_heads ", c.n_kv_heads, " must be in 1..1024");
  }
  if (c.n_q_heads == 0 || c.n_q_heads > 4096 || c.n_q_heads % c.n_kv_heads != 0) {
    return invalid_argument("n_q_heads ", c.n_q_heads, " must be in 1..4096 and a multiple of n_kv_heads ",
                            c.n_kv_heads);
  }
  if (c.head_dim < 32 || c.head_dim > 512 || c.head_dim % 8 != 0) {
    return invalid_argument("head_dim ", c.head_dim, " must be a multiple of 8 in 32..512");
  }
  if (enum_value(c.kv_dtype) > SSA_DTYPE_BF16) {
    return invalid_argument("unknown kv_dtype ", enum_value(c.kv_dtype), " (SSA_DTYPE_F32, _F16 or _BF16)");
  }
  if (c.pq_subspaces == 0 || c.head_dim % c.pq_subspaces != 0) {
    return invalid_argument("pq_subspaces ", c.pq_subspaces, " must divide head_dim ", c.head_dim);
  }
  if (c.pq_centroids < 2 || c.pq_centroids > 256) {
    return invalid_argument("pq_centroids ", c.pq_centroids, " must be in 2..256");
  }
  if (!is_pow2(c.page_tokens) || c.page_tokens < 16 || c.page_tokens > 4096) {
    return invalid_argument("page_tokens ", c.page_tokens, " must be a power of two in 16..4096");
  }
  const uint64_t page_bytes = 2ull * c.page_tokens * c.n_kv_heads * c.head_dim *
                              dtype_bytes(static_cast<DType>(c.kv_dtype));
  if (page_bytes > kMaxKvPageBytes) {
    return invalid_argument("a KV page of ", c.page_tokens, " tokens x ", c.n_kv_heads,
                            " KV heads x head_dim ", c.head_dim, " (K and V) takes ", page_bytes,
                            " bytes, more than the limit of ", kMaxKvPageBytes,
                            "; use a smaller page_tokens");
  }
  if ((c.flags & ~uint32_t{SSA_SESSION_HOST_POINTERS}) != 0) {
    return invalid_argument("unknown session flags 0x", absl::Hex(c.flags));
  }
  if (c.index_min_tokens == 0) return invalid_argument("index_min_tokens must be >= 1");
  if (!(c.index_regrow_factor == 0.0f || (c.index_regrow_factor >= 1.0f && c.index_regrow_factor < 1e9f))) {
    return invalid_argument("index_regrow_factor ", c.index_regrow_factor, " must be 0 or >= 1");
  }
  if (c.index_train_sample == 0) return invalid_argument("index_train_sample must be >= 1");
  if (c.index_iterations > 1000) {
    return invalid_argument("index_iterations ", c.index_iterations, " must be <= 1000");
  }
  layout->n_layers = c.n_layers;
  layout->n_q_heads = c.n_q_heads;
  layout->n_kv_heads = c.n_kv_heads;
  layout->head_dim = c.head_dim;
  layout->dtype = static_cast<DType>(c.kv_dtype);
  layout->pq_subspaces = c.pq_subspaces;
  layout->pq_centroids = c.pq_centroids;
  layout->page_tokens = c.page_tokens;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ssa_session>> create_session(ssa_runtime* rt,
                                                            const ssa_session_config& cfg) {
  KvLayout layout;
  SSA_RETURN_IF_ERROR(validate_session_config(cfg, &layout));
  if (rt->backend != SSA_BACKEND_CPU && rt->backend != SSA_BACKEND_CUDA) {
    return unsupported("sessions on backend ", static_cast<int>(rt->backend),
                       " are not available in this build");
  }
  auto s = std::make_unique<ssa_session>();
  s->rt = rt;
  s->config = cfg;
  s->config.struct_size = sizeof(ssa_session_config);
  s->layout = layout;
  s->kv_pool = PagePool::create(layout.kv_page_bytes());
  s->code_pool = PagePool::create(layout.code_page_bytes());
  if (rt->backend == SSA_BACKEND_CUDA) SSA_RETURN_IF_ERROR(cuda::init_session(*s));  // CUDA backend hook
  std::lock_guard lock(s->mu);
  s->layers.resize(cfg.n_layers);
  return s;
}

uint64_t session_length_locked(const ssa_session& s) {
  uint64_t n = UINT64_MAX;
  for (const LayerStore& l : s.layers) n = std::min(n, l.n_tokens);
  return s.layers.empty() ? 0 : n;
}

absl::Status session_append(ssa_session& s, uint32_t layer_index, const void* k, const void* v,
                            uint64_t n_tokens) {
  const KvLayout& L = s.layout;
  if (layer_index >= L.n_layers) {
    return invalid_argument("layer ", layer_index, " >= n_layers ", L.n_layers);
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (s.cuda != nullptr) return cuda::session_append(s, layer_index, k, v, n_tokens);  // CUDA backend hook
  std::unique_lock lock(s.mu);
  LayerStore& cur = s.layers[layer_index];
  if (n_tokens > kMaxTokensPerLayer - cur.n_tokens) {
    return invalid_argument("appending ", n_tokens, " tokens to layer ", layer_index, " of ",
                            cur.n_tokens, " exceeds the limit of ", kMaxTokensPerLayer,
                            " tokens per layer");
  }
  const uint64_t old_n = cur.n_tokens, new_n = old_n + n_tokens;
  const uint32_t P = L.page_tokens;
  const bool has_codes = cur.codebooks != nullptr;

  // The pages written are gathered aside; the layer changes at the commit only.
  LayerTail tail;
  SSA_RETURN_IF_ERROR(gather_tail(cur, L, new_n, *s.kv_pool, has_codes ? s.code_pool.get() : nullptr, &tail));

  // Copy rows: input is token-major [n][n_kv_heads][head_dim], pages head-major.
  const size_t row = L.row_bytes();
  const uint8_t* kb = static_cast<const uint8_t*>(k);
  const uint8_t* vb = static_cast<const uint8_t*>(v);
  for (uint64_t i = 0; i < n_tokens; ++i) {
    const uint64_t t = old_n + i;
    uint8_t* page = tail.kv_page(t / P).mutable_data();
    const uint32_t slot = static_cast<uint32_t>(t % P);
    for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
      memcpy(page + L.k_offset(h, slot), kb + (i * L.n_kv_heads + h) * row, row);
      memcpy(page + L.v_offset(h, slot), vb + (i * L.n_kv_heads + h) * row, row);
    }
  }

  if (index_wants_training(s.config, cur, new_n)) {
    LayerStore next = cur;  // every code is rebuilt: O(layer) anyway
    commit_tail(std::move(tail), &next);
    SSA_RETURN_IF_ERROR(retrain_layer(s, next));
    cur = std::move(next);
    return absl::OkStatus();
  }
  if (has_codes) {
    const uint64_t base = tail.first_page * P;  // the tail's pages start at this token
    // The layer's encoder, built again only when its codebooks change.
    if (s.encoders.size() < L.n_layers) s.encoders.resize(L.n_layers);
    std::shared_ptr<const PqEncoder>& enc = s.encoders[layer_index];
    if (enc == nullptr || enc->books() != cur.codebooks.get()) enc = std::make_shared<PqEncoder>(L, cur.codebooks);
    enc->encode(tail.kv, tail.code, old_n - base, new_n - base, *s.rt->pool);
  }
  commit_tail(std::move(tail), &cur);
  return absl::OkStatus();
}

absl::Status session_update_index(ssa_session& s) {
  std::unique_lock lock(s.mu);
  std::vector<LayerStore> next = s.layers;
  for (LayerStore& layer : next) {
    if (layer.n_tokens == 0) continue;
    SSA_RETURN_IF_ERROR(retrain_layer(s, layer));
  }
  s.layers.swap(next);
  return absl::OkStatus();
}

absl::Status session_ensure_index(ssa_session& s, uint32_t layer_index) {
  std::unique_lock lock(s.mu);
  LayerStore next = s.layers[layer_index];
  if (next.codebooks != nullptr || next.n_tokens == 0) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(retrain_layer(s, next));
  s.layers[layer_index] = std::move(next);
  return absl::OkStatus();
}

absl::Status session_truncate(ssa_session& s, uint64_t n_tokens) {
  std::unique_lock lock(s.mu);
  const uint64_t len = session_length_locked(s);
  if (n_tokens > len) {
    return invalid_argument("cannot truncate to ", n_tokens, " tokens: the session has ", len);
  }
  if (s.cuda != nullptr) SSA_RETURN_IF_ERROR(cuda::wait_for_readers_beyond(s, n_tokens));  // CUDA backend hook
  for (LayerStore& layer : s.layers) {
    if (layer.n_tokens <= n_tokens) continue;
    const uint64_t pages = s.layout.pages_for(n_tokens);
    layer.n_tokens = n_tokens;
    layer.kv_pages.resize(pages);
    if (layer.codebooks != nullptr) layer.code_pages.resize(pages);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ssa_session>> session_fork(ssa_session& s) {
  auto f = std::make_unique<ssa_session>();
  f->rt = s.rt;
  f->config = s.config;
  f->layout = s.layout;
  f->kv_pool = s.kv_pool;
  f->code_pool = s.code_pool;
  if (s.cuda != nullptr) {  // CUDA backend hook
    absl::StatusOr<std::shared_ptr<cuda::SessionState>> st = cuda::fork_state(*s.cuda);
    if (!st.ok()) return st.status();
    f->cuda = *std::move(st);
  }
  std::shared_lock lock(s.mu);
  std::lock_guard flock(f->mu);
  f->layers = s.layers;
  f->metadata = s.metadata;
  return f;
}

}  // namespace ssa
