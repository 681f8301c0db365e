// The CPU attention kernel alone (simd::Kernels::attend_rows): nanoseconds per
// row for each kernel set this CPU has, one thread, blocks of 32 rows of one KV
// head resident in L2, the group's query heads folded per row. The dense decode
// spends most of its compute here, so a change to a kernel is measured with this
// before the whole decode. Output: one line per (shape, kernel set), the best of
// --reps runs of --blocks blocks each, then a JSON line per result.
//
//   attend_rows_bench [--reps 7] [--blocks 20000]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "cpu/simd.h"

namespace {

using ssa::DType;

struct Shape {
  const char* name;
  DType dtype;
  uint32_t head_dim, group;
};

double ns_per_row(const ssa::simd::Kernels& k, const Shape& s, int reps, int blocks) {
  constexpr size_t kRows = 32, kSets = 16;  // 16 blocks of rows: 256 KB-1 MB, in L2
  const uint32_t d = s.head_dim;
  const size_t e = ssa::dtype_bytes(s.dtype);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> kb(kSets * kRows * d * e), vb(kb.size());
  for (size_t i = 0; i < kSets * kRows * d; ++i) {
    ssa::store_from_f32(kb.data(), s.dtype, i, nd(rng));
    ssa::store_from_f32(vb.data(), s.dtype, i, nd(rng));
  }
  std::vector<const void*> kr(kSets * kRows), vr(kr.size());
  for (size_t i = 0; i < kr.size(); ++i) {
    kr[i] = kb.data() + i * d * e;
    vr[i] = vb.data() + i * d * e;
  }
  std::vector<float> q(size_t{s.group} * d), m(s.group), l(s.group), acc(size_t{s.group} * d);
  for (auto& x : q) x = nd(rng) / 16.0f;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    std::fill(m.begin(), m.end(), -INFINITY);
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    const auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < blocks; ++b) {
      const size_t set = static_cast<size_t>(b) % kSets * kRows;
      k.attend_rows(s.dtype, kr.data() + set, vr.data() + set, kRows, d, q.data(), s.group, nullptr, m.data(),
                    l.data(), acc.data());
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ns / (double(blocks) * kRows));
  }
  // Keep the result alive.
  volatile float sink = acc[0] + l[0];
  (void)sink;
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, blocks = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--blocks")) blocks = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: attend_rows_bench [--reps N] [--blocks N]\n");
      return 2;
    }
  }
  const Shape shapes[] = {{"paper d256 f16 g4", DType::kF16, 256, 4}, {"llama d128 bf16 g4", DType::kBF16, 128, 4},
                          {"f32 d64 g2", DType::kF32, 64, 2}};
  const ssa::simd::Kernels* sets[] = {&ssa::simd::generic_kernels(), ssa::simd::avx2_kernels(),
                                      ssa::simd::avx512_kernels()};
  for (const Shape& s : shapes) {
    for (const ssa::simd::Kernels* k : sets) {
      if (k == nullptr) continue;
      const double ns = ns_per_row(*k, s, reps, blocks);
      printf("%-20s %-8s %8.1f ns/row\n", s.name, k->name, ns);
      printf("{\"shape\":\"%s\",\"kernels\":\"%s\",\"ns_per_row\":%.2f}\n", s.name, k->name, ns);
    }
  }
  return 0;
}
