// Measures what the load-time content checks cost next to the hash every read
// load already computes over the same bytes (warm memory, one thread): K/V
// finiteness per KV page, code range per code page. Not a test: prints a table.
//   content_check_cost [PAGES=512]   (benchmark shape: 4 KV heads, d=256, fp16,
//                                     256-token pages = 1 MiB KV + 16 KiB codes)
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#include <chrono>
#include <vector>

#include "common/dtype.h"
#include "snapshot/content_check.h"

int main(int argc, char** argv) {
  const size_t pages = argc > 1 ? static_cast<size_t>(atol(argv[1])) : 512;
  ssa::KvLayout lay;
  lay.n_layers = 1;
  lay.n_q_heads = 16;
  lay.n_kv_heads = 4;
  lay.head_dim = 256;
  lay.dtype = ssa::DType::kF16;
  lay.pq_subspaces = 16;
  lay.page_tokens = 256;
  const size_t kv = lay.kv_page_bytes(), code = lay.code_page_bytes();
  std::vector<uint8_t> kvs(pages * kv), codes(pages * code);
  uint32_t x = 12345;
  for (size_t i = 0; i < kvs.size() / 2; ++i) {
    x = x * 1664525u + 1013904223u;
    const uint16_t h = ssa::f32_to_f16(static_cast<float>(static_cast<int32_t>(x >> 8) % 2000) / 1000.0f);
    memcpy(&kvs[2 * i], &h, 2);
  }
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 7) % 15);
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto best_of = [&](auto&& fn) {
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      fn();
      best = std::min(best, secs(t0));
    }
    return best;
  };
  uint64_t sink = 0;
  const double h_kv = best_of([&] { for (size_t p = 0; p < pages; ++p) sink ^= XXH3_64bits(&kvs[p * kv], kv); });
  const double c_kv = best_of([&] {
    for (size_t p = 0; p < pages; ++p) sink += ssa::snap::check_kv_page(lay, &kvs[p * kv], "x", 0, p).ok();
  });
  const double h_code = best_of([&] { for (size_t p = 0; p < pages; ++p) sink ^= XXH3_64bits(&codes[p * code], code); });
  lay.pq_centroids = 16;  // 256 centroids: every byte is valid, the check is skipped
  const double c_code = best_of([&] {
    for (size_t p = 0; p < pages; ++p) sink += ssa::snap::check_code_page(lay, &codes[p * code], "x", 0, p).ok();
  });
  const double gb_kv = static_cast<double>(kvs.size()) / 1e9, gb_code = static_cast<double>(codes.size()) / 1e9;
  printf("%zu pages: %.3f GB of K/V, %.4f GB of codes (best of 5, one thread)\n\n", pages, gb_kv, gb_code);
  printf("| pass | time | rate | vs the hash of the same bytes |\n|---|---|---|---|\n");
  printf("| XXH3 of K/V pages | %.4f s | %.1f GB/s | |\n", h_kv, gb_kv / h_kv);
  printf("| K/V finite check | %.4f s | %.1f GB/s | %.0f%% |\n", c_kv, gb_kv / c_kv, 100 * c_kv / h_kv);
  printf("| XXH3 of code pages | %.5f s | %.1f GB/s | |\n", h_code, gb_code / h_code);
  printf("| code range check (16 centroids) | %.5f s | %.1f GB/s | %.0f%% |\n", c_code, gb_code / c_code,
         100 * c_code / h_code);
  printf("| code range check per token of K/V read | | | %.2f%% of the K/V hash |\n", 100 * c_code / h_kv);
  return sink == 42 ? 1 : 0;
}
