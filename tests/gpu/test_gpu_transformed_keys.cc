// The transformed proxies' keys on the GPU (kernels/pq_index.cu) at every head
// dim a session may have: the tiled transform of the k-means sample against a
// host reference with the CPU backend's order of operations (bit for bit), and
// the encode that transforms a range's keys first into a scratch against the
// one-pass encode (the same codes, the same bytes outside the range untouched),
// for 8-bit and 4-bit codes, ranges and scratches that are no multiple of the
// kernels' tiles or of a page.
#include <doctest/doctest.h>
#include <string.h>

#include <random>
#include <vector>

#include "kernels/pq_index.h"
#include "support/gpu_layer.h"

namespace ssa::gputest {
namespace {

// y = T x as lib/index/pq_index.cc computes it: eight interleaved partial sums
// per row, added pairwise, no fused multiply-adds (volatile keeps the compiler
// from contracting them).
void reference_transform(const float* t, const float* x, uint32_t d, float* y) {
  for (uint32_t i = 0; i < d; ++i) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t j = 0; j < d; j += 8)
      for (uint32_t k = 0; k < 8; ++k) {
        volatile float p = t[size_t{i} * d + j + k] * x[j + k];
        acc[k] += p;
      }
    y[i] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

std::vector<uint8_t> download_codes(const TestLayer& t) {
  const size_t bytes = t.L.code_page_bytes();
  std::vector<uint8_t> all(t.code_pages.size() * bytes);
  for (size_t p = 0; p < t.code_pages.size(); ++p)
    CUDA_OK(cudaMemcpy(all.data() + p * bytes, t.code_pages[p], bytes, cudaMemcpyDeviceToHost));
  return all;
}

void fill_codes(const TestLayer& t, uint8_t value) {
  for (uint8_t* p : t.code_pages) CUDA_OK(cudaMemset(p, value, t.L.code_page_bytes()));
}

struct KeyCase {
  uint32_t d, subspaces, centroids, code_bits;
};

TEST_CASE("gpu transformed keys: the tiled transform is the CPU's bits and encodes the one-pass kernel's codes") {
  SSA_GPU_TEST_OR_SKIP();
  const uint32_t n_kv = 2, n = 3001, page = 256, begin = 37, end = 2990;
  for (const KeyCase& kc : {KeyCase{32, 16, 256, 8}, KeyCase{64, 16, 256, 8}, KeyCase{128, 16, 256, 8},
                            KeyCase{128, 32, 16, 4}, KeyCase{256, 16, 256, 8}, KeyCase{512, 16, 256, 8},
                            KeyCase{512, 32, 16, 4}}) {
    const uint32_t d = kc.d;
    CAPTURE(d);
    CAPTURE(kc.code_bits);
    TestLayer t;
    build_layer(t, 2 * n_kv, n_kv, d, DType::kF16, n, page, kc.subspaces, kc.centroids, 500 + d, 3.0f, 0,
                kc.code_bits);
    cuda::PqIndexShape s{n_kv, d, kc.subspaces, kc.centroids, page, 8, DType::kF16, kc.code_bits, true};
    // Codebooks: the layer's centroids, then a random T and Q per head.
    std::mt19937_64 rng(77 + d);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> books(cuda::device_books_layout(s).floats());
    std::copy(t.books.begin(), t.books.end(), books.begin());
    for (size_t i = t.books.size(); i < books.size(); ++i) books[i] = nd(rng) / sqrtf(static_cast<float>(d));
    DevBuf<float> books_dev(books.size());
    books_dev.upload(books);
    const float* tr = books.data() + cuda::device_books_layout(s).key_transform_offset();

    // The k-means sample, transformed: n_s tokens spread evenly over the layer.
    const uint32_t n_s = 1000;
    DevBuf<uint8_t> work(cuda::kmeans_workspace_bytes(s, n_s));
    CUDA_OK(cuda::pq_gather_sample(s, t.kv_table.p, n, n_s, books_dev.p, work.p, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> x(size_t{n_kv} * n_s * d), ref(d);
    CUDA_OK(cudaMemcpy(x.data(), work.p, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (uint32_t h = 0; h < n_kv; ++h)
      for (uint32_t i = 0; i < n_s; ++i) {
        const uint64_t tok = uint64_t{i} * n / n_s;
        reference_transform(tr + size_t{h} * d * d, t.k.data() + (tok * n_kv + h) * d, d, ref.data());
        differ += memcmp(ref.data(), x.data() + (size_t{h} * n_s + i) * d, d * sizeof(float)) != 0;
      }
    CHECK(differ == 0);

    // The codes of [begin, end): one pass over pages filled with 0x5A, then
    // through scratches of 1000 keys over pages filled with 0xA5.
    fill_codes(t, 0x5A);
    CUDA_OK(cuda::pq_encode(s, t.kv_table.p, const_cast<uint8_t* const*>(t.code_table.p), books_dev.p, begin, end,
                            nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> one_pass = download_codes(t);
    fill_codes(t, 0xA5);
    DevBuf<uint8_t> scratch(cuda::pq_encode_scratch_bytes(s, 1000));
    CUDA_OK(cuda::pq_encode_transformed(s, t.kv_table.p, const_cast<uint8_t* const*>(t.code_table.p), books_dev.p,
                                        begin, end, reinterpret_cast<float*>(scratch.p), 1000, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> tiled = download_codes(t);
    // In the range the same codes (so both wrote them: the fills differ in
    // every nibble); outside it each run's fill.
    const size_t bytes = t.L.code_page_bytes();
    const std::vector<uint8_t> fill_a(bytes, 0x5A), fill_b(bytes, 0xA5);
    size_t same = 0, kept = 0, outside = 0;
    for (uint32_t tok = 0; tok < n; ++tok)
      for (uint32_t h = 0; h < n_kv; ++h)
        for (uint32_t m = 0; m < kc.subspaces; ++m) {
          const uint32_t a = t.L.code_at(one_pass.data() + tok / page * bytes, h, m, tok % page);
          const uint32_t b = t.L.code_at(tiled.data() + tok / page * bytes, h, m, tok % page);
          if (tok >= begin && tok < end) {
            same += a == b;
          } else {
            ++outside;
            kept += a == t.L.code_at(fill_a.data(), h, m, 0) && b == t.L.code_at(fill_b.data(), h, m, 0);
          }
        }
    CHECK(same == size_t{end - begin} * n_kv * kc.subspaces);
    CHECK(kept == outside);
  }
}

TEST_CASE("gpu transformed keys: the encode through a scratch refuses what it cannot do") {
  SSA_GPU_TEST_OR_SKIP();
  TestLayer t;
  build_layer(t, 2, 1, 64, DType::kF16, 600, 256, 16, 256, 9);
  cuda::PqIndexShape s{1, 64, 16, 256, 256, 8, DType::kF16, 8, true};
  DevBuf<float> books(cuda::device_books_layout(s).floats());
  DevBuf<uint8_t> scratch(cuda::pq_encode_scratch_bytes(s, 128));
  auto* codes = const_cast<uint8_t* const*>(t.code_table.p);
  auto* sp = reinterpret_cast<float*>(scratch.p);
  CHECK(cuda::pq_encode_transformed(s, t.kv_table.p, codes, books.p, 0, 600, sp, 0, nullptr) == cudaErrorInvalidValue);
  s.key_transform = false;  // plain keys take pq_encode
  CHECK(cuda::pq_encode_transformed(s, t.kv_table.p, codes, books.p, 0, 600, sp, 128, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssa::gputest
