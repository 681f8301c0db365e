// The proxy's scoring pass alone, per token per KV head, one thread: 8-bit PQ
// (M subspaces x 256 centroids, float table lookups) against the 4-bit proxy at
// the same bytes (2M subspaces x 16 centroids, 8-bit tables in registers), side
// by side in one run (the proxies alternate within every repetition).
//
// For each head dimension and byte budget, two measurements:
//   score_tokens  what a decode pays for one query head over the whole context
//                 (lib/decode/candidate_scores.cc: the table built, quantised for
//                 4-bit codes, then every token scored), with the kernels this
//                 CPU runs;
//   scan/<set>    the scan alone (Kernels::pq_scores or pq4_scores over every
//                 code page, table prebuilt) for each kernel set this CPU has.
// Codes and codebooks are random: the cost does not depend on their values.
// Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID: on a shared machine,
// the work apart from waiting for a core); the JSON lines also carry wall time.
// With --query-aware 1, the query-aware proxies too (qpq8, qpq4: the same codes
// and scan, plus the query's d x d transform that score_tokens applies once per
// query head and step), in the same alternation.
// With --group G (> 1), also score_group: what a decode's task per KV head pays
// per query head when it scores its G query heads together
// (score_tokens_group: every head's table over a chunk of codes before the
// next chunk), CPU ns per token per query head.
// Output: a table of median ns per token, then one JSON line per result.
//
//   proxy_scoring_bench [--tokens 1048576] [--reps 9] [--query-aware 1] [--group 4]
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "decode/candidate_scores.h"
#include "decode/quantized_lut.h"
#include "store/kv_layout.h"
#include "store/layer_store.h"
#include "store/page_pool.h"

namespace {

struct Proxy {
  std::string name;
  ssa::KvLayout layout;
  ssa::LayerStore layer;
};

Proxy make_proxy(uint32_t d, uint32_t bytes, bool four_bit, bool transformed, uint64_t n, std::mt19937_64& rng) {
  Proxy p;
  ssa::KvLayout& L = p.layout;
  L.n_layers = 1;
  L.n_q_heads = 1;
  L.n_kv_heads = 1;
  L.head_dim = d;
  L.dtype = ssa::DType::kF16;
  L.code_bits = four_bit ? 4 : 8;
  L.pq_subspaces = four_bit ? 2 * bytes : bytes;
  L.pq_centroids = four_bit ? 16 : 256;
  L.page_tokens = 256;
  p.name = std::string(transformed ? "q" : "") + (four_bit ? "pq4 " : "pq8 ") + std::to_string(L.pq_subspaces) +
           "x" + std::to_string(L.pq_centroids);
  auto books = std::make_shared<ssa::PqCodebooks>();
  books->n_kv_heads = 1;
  books->subspaces = L.pq_subspaces;
  books->centroids = L.pq_centroids;
  books->sub_dim = L.sub_dim();
  books->data.resize(size_t{L.pq_centroids} * d);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& x : books->data) x = nd(rng);
  if (transformed) {  // any values: the cost is the d x d product's
    books->rotation.resize(size_t{d} * d);
    books->query_transform.resize(size_t{d} * d);
    for (float& x : books->rotation) x = nd(rng);
    for (float& x : books->query_transform) x = nd(rng);
  }
  p.layer.codebooks = books;
  p.layer.n_tokens = n;
  auto pool = ssa::PagePool::create(L.code_page_bytes(), 0);
  for (uint64_t i = 0; i < L.pages_for(n); ++i) {
    ssa::PageRef page = *pool->allocate();
    uint8_t* b = page->mutable_data();
    for (size_t j = 0; j < L.code_page_bytes(); ++j) b[j] = static_cast<uint8_t>(rng());
    p.layer.code_pages.push_back(std::move(page));
  }
  return p;
}

// Wall and thread CPU seconds since a start.
struct Timer {
  std::chrono::steady_clock::time_point wall0 = std::chrono::steady_clock::now();
  double cpu0 = cpu_now();
  static double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  double wall() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(); }
  double cpu() const { return cpu_now() - cpu0; }
};

struct Time {
  double cpu = 0.0, wall = 0.0;
};

// The scan of every code page with kernel set k (the table prebuilt).
Time scan(const ssa::simd::Kernels& k, const Proxy& p, const std::vector<float>& lut, const uint8_t* lut8,
          ssa::QuantizedLut ql, float* scores) {
  const ssa::KvLayout& L = p.layout;
  const Timer t0;
  for (uint64_t t = 0; t < p.layer.n_tokens; t += L.page_tokens) {
    const uint64_t count = std::min<uint64_t>(L.page_tokens, p.layer.n_tokens - t);
    const uint8_t* codes = p.layer.code_pages[t / L.page_tokens]->data();
    if (L.code_bits == 4) {
      k.pq4_scores(lut8, L.pq_subspaces, codes, L.page_tokens, count, ql.scale, ql.bias, scores + t);
    } else {
      k.pq_scores(lut.data(), L.pq_centroids, L.pq_subspaces, codes, L.page_tokens, count, scores + t);
    }
  }
  return Time{t0.cpu(), t0.wall()};
}

double median(std::vector<Time> v, double Time::*field) {
  std::vector<double> x;
  for (const Time& t : v) x.push_back(t.*field);
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1 << 20;
  int reps = 9;
  bool query_aware = false;
  uint32_t group = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tokens")) n = strtoull(argv[i + 1], nullptr, 10);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--query-aware")) query_aware = atoi(argv[i + 1]) != 0;
    else if (!strcmp(argv[i], "--group")) group = static_cast<uint32_t>(atoi(argv[i + 1]));
    else {
      fprintf(stderr, "usage: %s [--tokens N] [--reps R] [--query-aware 0|1] [--group G]\n", argv[0]);
      return 2;
    }
  }
  std::vector<const ssa::simd::Kernels*> sets = {&ssa::simd::generic_kernels()};
  if (ssa::simd::avx2_kernels() != nullptr) sets.push_back(ssa::simd::avx2_kernels());
  if (ssa::simd::avx512_kernels() != nullptr) sets.push_back(ssa::simd::avx512_kernels());
  printf("proxy scoring, one thread, %llu tokens, median of %d; decode kernels: %s\n",
         static_cast<unsigned long long>(n), reps, ssa::simd::kernels().name);
  if (group < 1) group = 1;
  printf("%-6s %-6s %-14s %14s", "d", "bytes", "proxy", "score_tokens");
  if (group > 1) printf("  score_group/%-2u", group);
  for (const auto* k : sets) printf("  scan/%-8s", k->name);
  printf("   (CPU ns per token per KV head)\n");
  std::vector<std::string> json;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (uint32_t d : {64u, 128u, 256u}) {
    double pq8_16_ns = 0.0;  // the paper's proxy at this d, for the 32-byte 4-bit ratio
    for (uint32_t bytes : {16u, 32u}) {
      if (bytes > d) continue;
      std::vector<Proxy> proxies;
      for (bool transformed : {false, true}) {
        if (transformed && !query_aware) break;
        proxies.push_back(make_proxy(d, bytes, false, transformed, n, rng));
        proxies.push_back(make_proxy(d, bytes, true, transformed, n, rng));
      }
      const int P = static_cast<int>(proxies.size());
      std::vector<float> q(d), scores(n), lut, qg(size_t{group} * d), group_scores(group > 1 ? n * group : 0);
      for (float& x : q) x = nd(rng) / sqrtf(static_cast<float>(d));
      for (float& x : qg) x = nd(rng) / sqrtf(static_cast<float>(d));
      std::vector<std::vector<float>> luts;
      std::vector<std::vector<Time>> whole(P), grouped(P);
      std::vector<std::vector<std::vector<Time>>> scans(P, std::vector<std::vector<Time>>(sets.size()));
      double checksum = 0.0;
      for (int r = 0; r < reps; ++r) {
        for (int pi = 0; pi < P; ++pi) {
          const int slot = (pi + r) % P;  // rotate which goes first
          const Proxy& p = proxies[slot];
          const Timer t0;
          ssa::score_tokens(p.layout, p.layer, 0, q.data(), SSA_METHOD_PQ_TOPK, 0, n, &lut, scores.data());
          whole[slot].push_back(Time{t0.cpu(), t0.wall()});
          checksum += scores[n / 3];
          if (group > 1) {
            const Timer tg;
            ssa::score_tokens_group(p.layout, p.layer, 0, qg.data(), group, SSA_METHOD_PQ_TOPK, 0, n, &luts,
                                    group_scores.data(), n);
            grouped[slot].push_back(Time{tg.cpu() / group, tg.wall() / group});
            checksum += group_scores[n / 5];
          }
          // The tables score_tokens built, for the scans alone.
          const ssa::KvLayout& L = p.layout;
          std::vector<float> table(size_t{L.pq_subspaces} * L.pq_centroids);
          for (uint32_t m = 0; m < L.pq_subspaces; ++m)
            for (uint32_t c = 0; c < L.pq_centroids; ++c) {
              float s = 0.f;
              for (uint32_t j = 0; j < L.sub_dim(); ++j)
                s += q[m * L.sub_dim() + j] * p.layer.codebooks->centroid(0, m, c)[j];
              table[size_t{m} * L.pq_centroids + c] = s;
            }
          std::vector<uint8_t> lut8(size_t{L.pq_subspaces} * 16);
          const ssa::QuantizedLut ql =
              L.code_bits == 4 ? ssa::quantize_lut(table.data(), L.pq_subspaces, 16, lut8.data()) : ssa::QuantizedLut{};
          for (size_t k = 0; k < sets.size(); ++k) {
            scans[slot][k].push_back(scan(*sets[k], p, table, lut8.data(), ql, scores.data()));
            checksum += scores[n / 2];
          }
        }
      }
      const double per = 1e9 / static_cast<double>(n);
      for (int pi = 0; pi < P; ++pi) {
        printf("%-6u %-6u %-14s %14.3f", d, bytes, proxies[pi].name.c_str(), median(whole[pi], &Time::cpu) * per);
        std::string j = "{\"bench\":\"proxy_scoring\",\"head_dim\":" + std::to_string(d) +
                        ",\"bytes\":" + std::to_string(bytes) + ",\"proxy\":\"" + proxies[pi].name +
                        "\",\"tokens\":" + std::to_string(n) + ",\"score_tokens_cpu_ns\":" +
                        std::to_string(median(whole[pi], &Time::cpu) * per) + ",\"score_tokens_wall_ns\":" +
                        std::to_string(median(whole[pi], &Time::wall) * per);
        if (group > 1) {
          printf("  %15.3f", median(grouped[pi], &Time::cpu) * per);
          j += ",\"group\":" + std::to_string(group) + ",\"score_group_cpu_ns\":" +
               std::to_string(median(grouped[pi], &Time::cpu) * per);
        }
        for (size_t k = 0; k < sets.size(); ++k) {
          printf("  %13.3f", median(scans[pi][k], &Time::cpu) * per);
          j += std::string(",\"scan_") + sets[k]->name + "_cpu_ns\":" +
               std::to_string(median(scans[pi][k], &Time::cpu) * per) + ",\"scan_" + sets[k]->name +
               "_wall_ns\":" + std::to_string(median(scans[pi][k], &Time::wall) * per);
        }
        printf("\n");
        json.push_back(j + "}");
      }
      printf("%-6u %-6u %-14s %14.2fx  (pq8 16x256 at this d: %.2fx)\n", d, bytes, "pq8 / pq4",
             median(whole[0], &Time::cpu) / median(whole[1], &Time::cpu),
             bytes == 16 ? median(whole[0], &Time::cpu) / median(whole[1], &Time::cpu) : pq8_16_ns / (median(whole[1], &Time::cpu) * per));
      if (bytes == 16) pq8_16_ns = median(whole[0], &Time::cpu) * per;
      if (checksum == 12345.678) printf("!\n");  // keeps the scores alive
    }
  }
  for (const std::string& j : json) printf("%s\n", j.c_str());
  return 0;
}
