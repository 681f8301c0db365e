#include "pq_index.h"

#include <algorithm>
#include <memory>

#include "common/dtype.h"
#include "cpu/simd.h"
#include "kmeans.h"
#include "kmeans_rng.h"
#include "status.h"

namespace ssa {
namespace {

const uint8_t* key_row(const KvLayout& layout, const std::vector<PageRef>& pages, uint32_t head,
                       uint64_t token) {
  const Page& page = *pages[token / layout.page_tokens];
  return page.data() + layout.k_offset(head, static_cast<uint32_t>(token % layout.page_tokens));
}

}  // namespace

absl::StatusOr<CodebooksRef> train_codebooks(const KvLayout& layout, const LayerStore& layer,
                                             uint32_t sample, uint32_t iterations,
                                             ThreadPool& pool) {
  const uint64_t n_tokens = layer.n_tokens;
  if (n_tokens == 0) return invalid_argument("cannot train a PQ index on an empty layer");
  const uint64_t n = std::min<uint64_t>(n_tokens, sample);
  const uint32_t M = layout.pq_subspaces, K = layout.pq_centroids, dsub = layout.sub_dim();
  const uint32_t d = layout.head_dim;

  auto books = std::make_shared<PqCodebooks>();
  books->n_kv_heads = layout.n_kv_heads;
  books->subspaces = M;
  books->centroids = K;
  books->sub_dim = dsub;
  books->data.resize(size_t{layout.n_kv_heads} * M * K * dsub);

  // Gather the sampled keys of each head as floats, subspace-major, so every
  // (head, subspace) k-means reads one contiguous [n][dsub] array.
  std::vector<float> points(size_t{layout.n_kv_heads} * M * n * dsub);
  const auto& kern = simd::kernels();
  pool.parallel_for(layout.n_kv_heads, [&](size_t h) {
    std::vector<float> row(d);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t token = i * n_tokens / n;  // evenly spread, deterministic
      kern.to_f32(layout.dtype, key_row(layout, layer.kv_pages, static_cast<uint32_t>(h), token),
                  row.data(), d);
      for (uint32_t m = 0; m < M; ++m) {
        float* dst = points.data() + ((h * M + m) * n + i) * dsub;
        std::copy(row.begin() + m * dsub, row.begin() + (m + 1) * dsub, dst);
      }
    }
  });
  pool.parallel_for(size_t{layout.n_kv_heads} * M, [&](size_t hm) {
    const uint32_t h = static_cast<uint32_t>(hm / M), m = static_cast<uint32_t>(hm % M);
    kmeans_train(points.data() + hm * n * dsub, n, dsub, K, iterations, codebook_seed(h, m, M),
                 books->mutable_centroid(h, m, 0));
  });
  return CodebooksRef(std::move(books));
}

PqEncoder::PqEncoder(const KvLayout& layout, CodebooksRef books) : layout_(layout), books_(std::move(books)) {
  const uint32_t M = layout.pq_subspaces, dsub = layout.sub_dim();
  searches_.reserve(size_t{layout.n_kv_heads} * M);
  for (uint32_t h = 0; h < layout.n_kv_heads; ++h) {
    for (uint32_t m = 0; m < M; ++m) searches_.emplace_back(books_->centroid(h, m, 0), books_->centroids, dsub);
  }
}

void PqEncoder::encode(const std::vector<PageRef>& kv_pages, std::vector<PageRef>& code_pages, uint64_t begin,
                       uint64_t end, ThreadPool& pool) const {
  if (begin >= end) return;
  const KvLayout& layout = layout_;
  const uint32_t M = layout.pq_subspaces, dsub = layout.sub_dim(), d = layout.head_dim;
  const uint32_t P = layout.page_tokens;
  const uint64_t first_page = begin / P, last_page = (end - 1) / P;
  const auto& kern = simd::kernels();
  auto encode_page = [&](size_t i) {
    const uint64_t p = first_page + i;
    const uint64_t t0 = std::max<uint64_t>(begin, p * P), t1 = std::min<uint64_t>(end, (p + 1) * P);
    const Page& kv = *kv_pages[p];
    uint8_t* codes = code_pages[p]->mutable_data();
    std::vector<float> row(d);
    for (uint32_t h = 0; h < layout.n_kv_heads; ++h) {
      for (uint64_t t = t0; t < t1; ++t) {
        const uint32_t slot = static_cast<uint32_t>(t - p * P);
        kern.to_f32(layout.dtype, kv.data() + layout.k_offset(h, slot), row.data(), d);
        for (uint32_t m = 0; m < M; ++m) {
          codes[layout.code_offset(h, m) + slot] =
              static_cast<uint8_t>(searches_[size_t{h} * M + m].nearest(row.data() + m * dsub));
        }
      }
    }
  };
  // A single page (the usual small append) is encoded here, without a dispatch.
  if (first_page == last_page) {
    encode_page(0);
    return;
  }
  pool.parallel_for(last_page - first_page + 1, encode_page);
}

absl::StatusOr<std::vector<PageRef>> encode_layer(const KvLayout& layout, const CodebooksRef& books,
                                                  const LayerStore& layer, PagePool& code_pool,
                                                  ThreadPool& pool) {
  std::vector<PageRef> pages;
  pages.reserve(layer.kv_pages.size());
  for (size_t i = 0; i < layer.kv_pages.size(); ++i) {
    absl::StatusOr<PageRef> page = code_pool.allocate();
    if (!page.ok()) return page.status();
    pages.push_back(*std::move(page));
  }
  PqEncoder(layout, books).encode(layer.kv_pages, pages, 0, layer.n_tokens, pool);
  return pages;
}

bool index_wants_training(const ssa_session_config& cfg, const LayerStore& layer,
                          uint64_t new_length) {
  if (layer.codebooks == nullptr) return new_length >= cfg.index_min_tokens;
  if (cfg.index_regrow_factor <= 0.0f) return false;
  return static_cast<double>(new_length) >=
         static_cast<double>(cfg.index_regrow_factor) * static_cast<double>(layer.trained_at_tokens);
}

}  // namespace ssa
