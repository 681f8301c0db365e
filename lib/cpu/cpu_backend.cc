// The CPU backend: pages in host memory from the session's page pools, rows
// copied and PQ-encoded on the runtime's thread pool, decode by the CPU pipeline
// (lib/decode/cpu_decode.h). It keeps no state of its own per session.
#include <string.h>

#include <exception>
#include <memory>
#include <mutex>
#include <new>

#include "backend.h"
#include "decode/cpu_decode.h"
#include "decode/decode.h"
#include "index/pq_index.h"
#include "session.h"
#include "shard/callback_collective.h"
#include "shard/group_index.h"
#include "status.h"
#include "store/layer_tail.h"

namespace ssa {
namespace {

class CpuBackend final : public Backend {
 public:
  absl::Status check_device(int) const override { return absl::OkStatus(); }
  // In-process shards: the ordinals only name them.
  absl::Status prepare_shard_devices(const std::vector<int32_t>&) const override { return absl::OkStatus(); }
  absl::Status init_session(ssa_session&) const override { return absl::OkStatus(); }
  absl::Status init_fork(const ssa_session&, ssa_session&) const override { return absl::OkStatus(); }
  void session_destroyed(int) const override {}

  bool device_buffers() const override { return false; }
  absl::Status check_buffer(const ssa_session&, const void*, const char*) const override {
    return absl::OkStatus();
  }

  // The stream is not used: the rows are host memory, read during the call.
  absl::Status prepare_append(const ssa_session&, bool, void*) const override { return absl::OkStatus(); }

  absl::Status gather_tail(ssa_session& s, LayerStore& layer, uint64_t new_n, bool codes,
                           LayerTail* tail) const override {
    return ssa::gather_tail(layer, s.layout, new_n, *s.kv_pool, codes ? s.code_pool.get() : nullptr, tail,
                            s.rt->held);
  }

  absl::Status write_rows(ssa_session& s, const AppendRows& rows, const LayerStore& layer,
                          LayerTail& tail) const override {
    // Input is token-major [n][n_kv_heads][head_dim], pages head-major. A rank
    // of a group keeps the rows of its shard only (the tail holds no other page).
    const KvLayout& L = s.layout;
    const uint32_t P = L.page_tokens;
    const size_t row = L.row_bytes();
    const uint8_t* kb = static_cast<const uint8_t*>(rows.k);
    const uint8_t* vb = static_cast<const uint8_t*>(rows.v);
    const HeldRange& held = s.rt->held;
    const uint64_t lo = held.lo(rows.old_n), hi = held.hi(rows.new_n);
    for (uint64_t t = lo; t < hi; ++t) {
      const uint64_t i = t - rows.old_n;
      uint8_t* page = tail.kv_page(t / P).mutable_data();
      const uint32_t slot = static_cast<uint32_t>(t % P);
      for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
        memcpy(page + L.k_offset(h, slot), kb + (i * L.n_kv_heads + h) * row, row);
        memcpy(page + L.v_offset(h, slot), vb + (i * L.n_kv_heads + h) * row, row);
      }
    }
    if (!rows.encode || lo >= hi) return absl::OkStatus();
    const uint64_t base = tail.first_page * P;  // the tail's pages start at this token
    // The layer's encoder, built again only when its codebooks change.
    if (s.encoders.size() < L.n_layers) s.encoders.resize(L.n_layers);
    std::shared_ptr<const PqEncoder>& enc = s.encoders[rows.layer];
    if (enc == nullptr || enc->books() != layer.codebooks.get())
      enc = std::make_shared<PqEncoder>(L, layer.codebooks, s.config.pq_parallel_weight);
    enc->encode(tail.kv, tail.code, lo - base, hi - base, *s.rt->pool);
    return absl::OkStatus();
  }

  // A rank of a group trains on the sample gathered over the group
  // (lib/shard/group_index.h) and encodes its own keys.
  absl::Status train_index(ssa_session& s, LayerStore& layer) const override {
    if (layer.n_tokens == 0) return invalid_argument("cannot train a PQ index on an empty layer");
    const uint64_t n = sample_count(layer.n_tokens, s.config.index_train_sample);
    std::vector<float> keys;
    if (s.rt->group != nullptr) {
      auto read = [&](uint64_t i0, uint64_t i1, float* out) {
        read_sample_keys(s.layout, layer, n, i0, i1, *s.rt->pool, out);
        return absl::OkStatus();
      };
      SSA_RETURN_IF_ERROR(
          gather_sample_keys(*s.rt->group, s.layout, layer.n_tokens, s.rt->shard_tokens, n, read, &keys));
    } else {
      keys.resize(size_t{s.layout.n_kv_heads} * n * s.layout.head_dim);
      read_sample_keys(s.layout, layer, n, 0, n, *s.rt->pool, keys.data());
    }
    absl::StatusOr<CodebooksRef> books =
        train_codebooks_on(s.layout, keys, n, s.config.index_iterations, s.config.proxy,
                           s.config.pq_parallel_weight, layer.query_moments, *s.rt->pool);
    if (!books.ok()) return books.status();
    absl::StatusOr<std::vector<PageRef>> codes = encode_layer(s.layout, *books, s.config.pq_parallel_weight, layer,
                                                              *s.code_pool, *s.rt->pool, s.rt->held);
    if (!codes.ok()) return codes.status();
    layer.codebooks = *std::move(books);
    layer.code_pages = *std::move(codes);
    layer.trained_at_tokens = layer.n_tokens;
    return absl::OkStatus();
  }

  // Decodes read under the session lock and are done when they return.
  absl::Status before_truncate(ssa_session&, uint64_t) const override { return absl::OkStatus(); }

  absl::Status check_decode(const ssa_session&, uint32_t, const ssa_decode_params&) const override {
    return absl::OkStatus();
  }

  absl::Status decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index, const void* q,
                            void* out, const ssa_decode_params& p, uint64_t seed, ssa_decode_stats* stats,
                            std::vector<HeadTrace>* traces, DecodeProfile* profile) const override {
    return cpu_decode_layer(s, layer, layer_index, q, out, p, seed, stats, traces, profile);
  }
  bool records_traces() const override { return true; }

  // Items in parallel on the runtime's threads, each as ssa_decode; the error of
  // the first failing item (by index) is reported.
  absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                            const ssa_decode_params& p) const override {
    // A rank of a group of processes: every item is a collective call, made in
    // item order on this thread (the ranks' exchanges must come in one order).
    if (items[0].session->rt->group != nullptr) {
      for (size_t i = 0; i < n_items; ++i) {
        absl::Status st = decode(*items[i].session, layer, items[i].q, items[i].out, p, nullptr);
        if (!st.ok()) return make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
      }
      return absl::OkStatus();
    }
    std::mutex mu;
    absl::Status first = absl::OkStatus();
    size_t first_index = n_items;
    items[0].session->rt->pool->parallel_for(n_items, [&](size_t i) {
      absl::Status st;
      try {
        st = decode(*items[i].session, layer, items[i].q, items[i].out, p, nullptr);
      } catch (const std::bad_alloc&) {
        st = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory");
      } catch (const std::exception& e) {
        st = make_error(SSA_ERR_INTERNAL, e.what());
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_index) {
          first_index = i;
          first = make_error(status_code(st), absl::StrCat("item ", i, ": ", st.message()));
        }
      }
    });
    return first;
  }

  absl::StatusOr<PageRef> page_from_host(const ssa_session& s, bool kv, uint64_t, size_t bytes,
                                         absl::FunctionRef<uint8_t*()>,
                                         absl::FunctionRef<absl::Status(uint8_t*)> fill) const override {
    absl::StatusOr<PageRef> page = (kv ? s.kv_pool : s.code_pool)->allocate();
    if (!page.ok()) return page.status();
    if ((*page)->bytes() < bytes || (*page)->mutable_data() == nullptr) {
      return make_error(SSA_ERR_INTERNAL, "page pool returned an unusable page");
    }
    SSA_RETURN_IF_ERROR(fill((*page)->mutable_data()));
    return page;
  }

  absl::StatusOr<const uint8_t*> page_to_host(const ssa_session&, const Page& page, size_t,
                                              absl::FunctionRef<uint8_t*()>) const override {
    return page.data();
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend{};
  return backend;
}

}  // namespace ssa
