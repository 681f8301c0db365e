#include "candidate_scores.h"

#include <algorithm>

#include "cpu/simd.h"
#include "decode/quantized_lut.h"
#include "index/pq_index.h"

namespace ssa {
namespace {

void pq_proxy_scores(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                     uint64_t t0, uint64_t t1, std::vector<float>* lut, float* scores) {
  const PqCodebooks& books = *layer.codebooks;
  const uint32_t M = layout.pq_subspaces, K = layout.pq_centroids, dsub = layout.sub_dim();
  const bool four_bit = layout.code_bits == 4;
  // The table, then room for the rotated query (OPQ: rotated once per call),
  // then (4-bit codes) the [M][16] byte table.
  lut->resize(size_t{M} * K + layout.head_dim + (four_bit ? size_t{M} * 16 / sizeof(float) : 0));
  q = rotate_query(books, kv_head, q, lut->data() + size_t{M} * K);
  for (uint32_t m = 0; m < M; ++m) {
    const float* qm = q + m * dsub;
    for (uint32_t c = 0; c < K; ++c) {
      const float* cen = books.centroid(kv_head, m, c);
      float s = 0.0f;
      for (uint32_t j = 0; j < dsub; ++j) s += qm[j] * cen[j];
      (*lut)[size_t{m} * K + c] = s;
    }
  }
  const auto& kern = simd::kernels();
  const uint32_t P = layout.page_tokens;
  uint8_t* lut8 = reinterpret_cast<uint8_t*>(lut->data() + size_t{M} * K + layout.head_dim);
  const QuantizedLut ql = four_bit ? quantize_lut(lut->data(), M, K, lut8) : QuantizedLut{};
  for (uint64_t t = t0; t < t1;) {
    const uint64_t page = t / P;
    const uint64_t end = std::min<uint64_t>(t1, (page + 1) * P);
    const uint8_t* codes = layer.code_pages[page]->data() + layout.code_offset(kv_head, 0) + t % P;
    if (four_bit) {
      kern.pq4_scores(lut8, M, codes, P, end - t, ql.scale, ql.bias, scores + (t - t0));
    } else {
      kern.pq_scores(lut->data(), K, M, codes, P, end - t, scores + (t - t0));
    }
    t = end;
  }
}

void exact_scores(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                  uint64_t t0, uint64_t t1, float* scores) {
  const auto& kern = simd::kernels();
  const uint32_t P = layout.page_tokens;
  for (uint64_t t = t0; t < t1; ++t) {
    const uint8_t* row = layer.kv_pages[t / P]->data() + layout.k_offset(kv_head, static_cast<uint32_t>(t % P));
    scores[t - t0] = kern.dot(layout.dtype, row, q, layout.head_dim);
  }
}

}  // namespace

void score_tokens(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                  ssa_method method, uint64_t t0, uint64_t t1, std::vector<float>* lut, float* scores) {
  if (t0 >= t1) return;
  if (method == SSA_METHOD_ORACLE_TOPK) {
    exact_scores(layout, layer, kv_head, q, t0, t1, scores);
  } else {
    pq_proxy_scores(layout, layer, kv_head, q, t0, t1, lut, scores);
  }
}

}  // namespace ssa
