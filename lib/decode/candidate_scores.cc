#include "candidate_scores.h"

#include <algorithm>

#include "cpu/simd.h"
#include "decode/quantized_lut.h"
#include "index/pq_index.h"

namespace ssa {
namespace {

// Tokens per chunk of score_tokens_group (rounded down to whole pages, at least
// one): 16 KB of codes per KV head at PQ's 16 bytes per token.
constexpr uint64_t kGroupChunkTokens = 1024;

// The proxy's lookup table for query q (rotated or transformed first for the
// proxies that learn one), held in `lut`: the float table [M][K], room for the
// rotated query, then (4-bit codes) the [M][16] byte table, whose scale and bias
// are in `quant`.
struct ProxyTable {
  const float* f32 = nullptr;
  const uint8_t* u8 = nullptr;
  QuantizedLut quant;
};

ProxyTable build_table(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                       std::vector<float>* lut) {
  const PqCodebooks& books = *layer.codebooks;
  const uint32_t M = layout.pq_subspaces, K = layout.pq_centroids, dsub = layout.sub_dim();
  const bool four_bit = layout.code_bits == 4;
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
  ProxyTable t;
  t.f32 = lut->data();
  if (four_bit) {
    uint8_t* lut8 = reinterpret_cast<uint8_t*>(lut->data() + size_t{M} * K + layout.head_dim);
    t.quant = quantize_lut(lut->data(), M, K, lut8);
    t.u8 = lut8;
  }
  return t;
}

// Scores of tokens [t0, t1) from one table, a page's codes at a time.
void scan_codes(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const ProxyTable& t,
                uint64_t t0, uint64_t t1, float* scores) {
  const auto& kern = simd::kernels();
  const uint32_t P = layout.page_tokens, M = layout.pq_subspaces, K = layout.pq_centroids;
  for (uint64_t tok = t0; tok < t1;) {
    const uint64_t page = tok / P;
    const uint64_t end = std::min<uint64_t>(t1, (page + 1) * P);
    const uint8_t* codes = layer.code_pages[page]->data() + layout.code_offset(kv_head, 0) + tok % P;
    if (t.u8 != nullptr) {
      kern.pq4_scores(t.u8, M, codes, P, end - tok, t.quant.scale, t.quant.bias, scores + (tok - t0));
    } else {
      kern.pq_scores(t.f32, K, M, codes, P, end - tok, scores + (tok - t0));
    }
    tok = end;
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
    scan_codes(layout, layer, kv_head, build_table(layout, layer, kv_head, q, lut), t0, t1, scores);
  }
}

void score_tokens_group(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head, const float* q,
                        uint32_t g, ssa_method method, uint64_t t0, uint64_t t1, std::vector<std::vector<float>>* luts,
                        float* scores, size_t stride) {
  if (t0 >= t1) return;
  const uint32_t d = layout.head_dim, P = layout.page_tokens;
  std::vector<ProxyTable> tables;
  if (method != SSA_METHOD_ORACLE_TOPK) {
    luts->resize(g);
    for (uint32_t j = 0; j < g; ++j) {
      tables.push_back(build_table(layout, layer, kv_head, q + size_t{j} * d, &(*luts)[j]));
    }
  }
  // Chunks of whole pages (their codes or keys stay in the core's caches while
  // each head of the group scans them); every token's score is the one
  // score_tokens gives it.
  const uint64_t chunk = std::max<uint64_t>(P, kGroupChunkTokens / P * P);
  for (uint64_t c0 = t0; c0 < t1;) {
    const uint64_t c1 = std::min<uint64_t>(t1, (c0 / chunk + 1) * chunk);
    for (uint32_t j = 0; j < g; ++j) {
      float* out = scores + j * stride + (c0 - t0);
      if (method == SSA_METHOD_ORACLE_TOPK) {
        exact_scores(layout, layer, kv_head, q + size_t{j} * d, c0, c1, out);
      } else {
        scan_codes(layout, layer, kv_head, tables[j], c0, c1, out);
      }
    }
    c0 = c1;
  }
}

}  // namespace ssa
