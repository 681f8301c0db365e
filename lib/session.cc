#include "session.h"

#include <stddef.h>

#include <algorithm>

#include "backend.h"
#include "cpu/finite_check.h"
#include "cpu/simd.h"
#include "decode/decode_step.h"
#include "index/pq_index.h"
#include "index/proxy_kind.h"
#include "index/query_transform.h"
#include "shard/callback_collective.h"
#include "shard/group_index.h"
#include "status.h"
#include "versioned_struct.h"
#include "store/layer_tail.h"

ssa_session::~ssa_session() {
  if (rt != nullptr && rt->budget_peers != nullptr) rt->budget_peers->leave(this);
}

namespace ssa {
namespace {

bool is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

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
  if (!proxy_is_known(enum_value(c.proxy))) {
    return invalid_argument("unknown proxy ", enum_value(c.proxy), " (SSA_PROXY_PQ, _OPQ, _PQ4, _OPQ4, _QPQ or _QPQ4)");
  }
  if (proxy_has_4bit_codes(c.proxy)) {
    if (c.pq_centroids > 16) {
      return invalid_argument("pq_centroids ", c.pq_centroids, " must be in 2..16 for a 4-bit proxy (proxy ",
                              enum_value(c.proxy), "); 32 subspaces x 16 centroids cost PQ's 16 bytes per token");
    }
    if (c.pq_subspaces % 2 != 0 || c.pq_subspaces > kMax4BitSubspaces) {
      return invalid_argument("pq_subspaces ", c.pq_subspaces, " must be even and at most ", kMax4BitSubspaces,
                              " for a 4-bit proxy (two codes per byte; 8-bit table sums stay below 2^16)");
    }
  }
  if (!(c.pq_parallel_weight == 0.0f || (c.pq_parallel_weight >= 1.0f && c.pq_parallel_weight <= 1000.0f))) {
    return invalid_argument("pq_parallel_weight ", c.pq_parallel_weight,
                            " must be 0 or in [1, 1000] (0 and 1: squared error)");
  }
  layout->n_layers = c.n_layers;
  layout->n_q_heads = c.n_q_heads;
  layout->n_kv_heads = c.n_kv_heads;
  layout->head_dim = c.head_dim;
  layout->dtype = static_cast<DType>(c.kv_dtype);
  layout->pq_subspaces = c.pq_subspaces;
  layout->pq_centroids = c.pq_centroids;
  layout->code_bits = proxy_has_4bit_codes(c.proxy) ? 4 : 8;
  layout->page_tokens = c.page_tokens;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ssa_session>> create_session(ssa_runtime* rt,
                                                            const ssa_session_config& cfg) {
  KvLayout layout;
  SSA_RETURN_IF_ERROR(validate_session_config(cfg, &layout));
  const Backend* backend = backend_of(rt->backend);
  if (backend == nullptr) {
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
  s->backend = backend;
  SSA_RETURN_IF_ERROR(backend->init_session(*s));
  std::lock_guard lock(s->mu);
  s->layers.resize(cfg.n_layers);
  return s;
}

uint64_t session_length_locked(const ssa_session& s) {
  uint64_t n = UINT64_MAX;
  for (const LayerStore& l : s.layers) n = std::min(n, l.n_tokens);
  return s.layers.empty() ? 0 : n;
}

void session_destroy(ssa_session* s) {
  if (s == nullptr) return;
  const Backend* backend = s->backend;
  const std::vector<int32_t> devices = s->rt->devices;  // a sharded session's every device
  delete s;
  if (backend != nullptr)
    for (const int32_t device : devices) backend->session_destroyed(device);
}

namespace {

// Trains one layer's index. On a group's runtime it is a collective call every
// rank makes (lib/shard/group_index.h); `before` is this rank's failure of the
// work that led to it (an append's copy), which its peers then also return.
absl::Status train_layer(ssa_session& s, uint32_t layer_index, LayerStore& layer,
                         const absl::Status& before = absl::OkStatus()) {
  if (s.rt->group == nullptr) {
    SSA_RETURN_IF_ERROR(before);
    return s.backend->train_index(s, layer);
  }
  return group_train(*s.rt->group, layer_index, layer, s.config, before,
                     [&] { return s.backend->train_index(s, layer); });
}

struct AppendCall {
  uint32_t layer;
  const void* k;
  const void* v;
  uint64_t n_tokens;
  bool async;
  void* stream;
};

// The sizes of an append that need no lock, before anything reads k or v: a
// hostile n_tokens is rejected, not used to read far beyond the caller's arrays.
absl::Status check_append(const ssa_session& s, const AppendCall& a) {
  const KvLayout& L = s.layout;
  if (a.k == nullptr || a.v == nullptr) return invalid_argument("k and v must not be NULL");
  if (a.layer >= L.n_layers) return invalid_argument("layer ", a.layer, " >= n_layers ", L.n_layers);
  if (a.n_tokens > kMaxTokensPerLayer) {
    return invalid_argument("n_tokens ", a.n_tokens, " exceeds the limit of ", kMaxTokensPerLayer,
                            " tokens per layer");
  }
  if (a.n_tokens > (SIZE_MAX / 2) / L.token_bytes()) {
    return invalid_argument("n_tokens ", a.n_tokens, " overflows the size of K and V");
  }
  SSA_RETURN_IF_ERROR(s.backend->check_buffer(s, a.k, "k"));
  return s.backend->check_buffer(s, a.v, "v");
}

absl::Status check_finite_rows(const ssa_session& s, const AppendCall& a) {
  const size_t n = static_cast<size_t>(a.n_tokens) * s.layout.n_kv_heads * s.layout.head_dim;
  size_t bad = first_non_finite(s.layout.dtype, a.k, n);
  if (bad != n) return invalid_argument("k[", bad, "] is NaN or infinite");
  bad = first_non_finite(s.layout.dtype, a.v, n);
  if (bad != n) return invalid_argument("v[", bad, "] is NaN or infinite");
  return absl::OkStatus();
}

// The one append: checks, gather the tail, the backend copies and encodes,
// then retrain or commit. The layer changes only at the commit.
absl::Status append(ssa_session& s, const AppendCall& a) {
  if (a.n_tokens == 0) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(check_append(s, a));
  SSA_RETURN_IF_ERROR(s.backend->prepare_append(s, a.async, a.stream));
  std::unique_lock lock(s.mu);
  SSA_RETURN_IF_ERROR(session_settle_locked(s, false));
  LayerStore& cur = s.layers[a.layer];
  if (a.n_tokens > kMaxTokensPerLayer - cur.n_tokens) {
    return invalid_argument("appending ", a.n_tokens, " tokens to layer ", a.layer, " of ", cur.n_tokens,
                            " exceeds the limit of ", kMaxTokensPerLayer, " tokens per layer");
  }
  // The append writes pages of the reservation's: it ends the reservation.
  SSA_RETURN_IF_ERROR(session_settle_locked(s, true));
  // Every size is checked: the caller's n_tokens rows may now be read.
  const bool host = host_buffers(s);
  // A group's ranks check every row (not only their shard's), so that rows
  // they were all given refuse on every rank without an exchange.
  absl::Status st = host ? check_finite_rows(s, a) : absl::OkStatus();
  AppendRows rows;
  rows.layer = a.layer;
  rows.k = a.k;
  rows.v = a.v;
  rows.old_n = cur.n_tokens;
  rows.new_n = cur.n_tokens + a.n_tokens;
  rows.trains = index_wants_training(s.config, cur, rows.new_n);
  const bool has_codes = cur.codebooks != nullptr;
  rows.encode = has_codes && !rows.trains;
  rows.async = a.async && !host;
  rows.stream = a.stream;
  LayerTail tail;
  if (st.ok()) st = s.backend->gather_tail(s, cur, rows.new_n, has_codes, &tail);
  if (st.ok()) st = s.backend->write_rows(s, rows, cur, tail);
  if (rows.trains) {
    // A group's ranks all reach this training: one that failed above (rows
    // only it was given, its memory) still takes part in its first exchange,
    // so that the others return its error instead of waiting for it.
    LayerStore next = cur;  // every code is rebuilt: O(layer) anyway
    if (st.ok()) commit_tail(std::move(tail), &next);
    SSA_RETURN_IF_ERROR(train_layer(s, a.layer, next, st));
    cur = std::move(next);
    return absl::OkStatus();
  }
  SSA_RETURN_IF_ERROR(st);
  commit_tail(std::move(tail), &cur);
  return absl::OkStatus();
}

}  // namespace

absl::Status session_append(ssa_session& s, uint32_t layer, const void* k, const void* v,
                            uint64_t n_tokens) {
  return append(s, AppendCall{layer, k, v, n_tokens, false, nullptr});
}

absl::Status session_append_async(ssa_session& s, uint32_t layer, const void* k, const void* v,
                                  uint64_t n_tokens, void* stream) {
  return append(s, AppendCall{layer, k, v, n_tokens, true, stream});
}

absl::Status session_update_index(ssa_session& s) {
  std::unique_lock lock(s.mu);
  // New codebooks re-encode every code: a reservation's steps would encode
  // with the old ones, so it ends here.
  SSA_RETURN_IF_ERROR(session_settle_locked(s, true));
  std::vector<LayerStore> next = s.layers;
  for (uint32_t l = 0; l < next.size(); ++l) {
    if (next[l].n_tokens == 0) continue;
    SSA_RETURN_IF_ERROR(train_layer(s, l, next[l]));
  }
  s.layers.swap(next);
  return absl::OkStatus();
}

absl::Status session_observe_queries(ssa_session& s, uint32_t layer, const void* q, uint64_t n) {
  if (n == 0) return absl::OkStatus();
  const KvLayout& L = s.layout;
  if (q == nullptr) return invalid_argument("q must not be NULL");
  if (layer >= L.n_layers) return invalid_argument("layer ", layer, " >= n_layers ", L.n_layers);
  if (!proxy_is_query_aware(s.config.proxy)) {
    return invalid_argument("proxy ", enum_value(s.config.proxy),
                            " learns nothing from queries (SSA_PROXY_QPQ and _QPQ4 do)");
  }
  if (n > kMaxObservedQueryValues / (uint64_t{L.n_q_heads} * L.head_dim)) {
    return invalid_argument(n, " queries of ", L.n_q_heads, " x ", L.head_dim, " values in one call exceed ",
                            kMaxObservedQueryValues, " values");
  }
  SSA_RETURN_IF_ERROR(s.backend->check_buffer(s, q, "q"));
  const size_t count = static_cast<size_t>(n) * L.n_q_heads * L.head_dim;
  // Device queries (CUDA sessions) come to the host first: the moments are
  // accumulated by the same code, in double, on every backend.
  std::vector<uint8_t> staged;
  const void* src = q;
  if (!host_buffers(s)) {
    staged.resize(count * dtype_bytes(L.dtype));
    SSA_RETURN_IF_ERROR(s.backend->copy_to_host(s, q, staged.size(), staged.data()));
    src = staged.data();
  }
  std::vector<float> qf(count);
  simd::kernels().to_f32(L.dtype, src, qf.data(), count);
  const size_t bad = first_non_finite(DType::kF32, qf.data(), count);
  if (bad != count) return invalid_argument("q[", bad, "] is NaN or infinite");
  std::unique_lock lock(s.mu);
  LayerStore& cur = s.layers[layer];
  const uint64_t seen = cur.query_moments != nullptr ? cur.query_moments->count[0] : 0;
  if (n * (L.n_q_heads / L.n_kv_heads) > kMaxQueryCount - seen) {
    return invalid_argument("layer ", layer, " would have observed more than ", kMaxQueryCount,
                            " queries per KV head");
  }
  cur.query_moments = add_query_moments(cur.query_moments.get(), L.n_kv_heads, L.n_q_heads, L.head_dim, qf.data(), n,
                                        s.rt->pool.get());
  return absl::OkStatus();
}

absl::Status session_ensure_index(ssa_session& s, uint32_t layer_index) {
  std::unique_lock lock(s.mu);
  LayerStore next = s.layers[layer_index];
  if (next.codebooks != nullptr || next.n_tokens == 0) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(train_layer(s, layer_index, next));
  s.layers[layer_index] = std::move(next);
  return absl::OkStatus();
}

void session_install_index(ssa_session& s, uint32_t layer_index, LayerStore trained) {
  std::unique_lock lock(s.mu);
  LayerStore& cur = s.layers[layer_index];
  // Only onto the layer it was trained from: still without an index, the same
  // tokens in the same pages (a page written since is a new page).
  if (cur.codebooks != nullptr || trained.codebooks == nullptr || cur.n_tokens != trained.n_tokens ||
      cur.kv_pages != trained.kv_pages) {
    return;
  }
  cur = std::move(trained);
}

absl::Status session_truncate(ssa_session& s, uint64_t n_tokens) {
  std::unique_lock lock(s.mu);
  SSA_RETURN_IF_ERROR(session_settle_locked(s, false));
  const uint64_t len = session_length_locked(s);
  if (n_tokens > len) {
    return invalid_argument("cannot truncate to ", n_tokens, " tokens: the session has ", len);
  }
  SSA_RETURN_IF_ERROR(session_settle_locked(s, true));
  SSA_RETURN_IF_ERROR(s.backend->before_truncate(s, n_tokens));
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
  // The fork shares the pages a reservation's steps write into: it ends there.
  SSA_RETURN_IF_ERROR(session_settle(s, true));
  auto f = std::make_unique<ssa_session>();
  f->rt = s.rt;
  f->config = s.config;
  f->layout = s.layout;
  f->kv_pool = s.kv_pool;
  f->code_pool = s.code_pool;
  f->backend = s.backend;
  SSA_RETURN_IF_ERROR(s.backend->init_fork(s, *f));
  std::shared_lock lock(s.mu);
  std::lock_guard flock(f->mu);
  f->layers = s.layers;
  f->metadata = s.metadata;
  return f;
}

}  // namespace ssa
