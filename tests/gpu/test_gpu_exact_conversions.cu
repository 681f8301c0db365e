// The decode kernels replace two float-to-integer conversions per candidate with
// adds and bit operations (kernels/device_util.cuh). The selection and the sampling
// weights must stay bit for bit what the conversions give, so both are checked here
// against the conversion instructions on every float they can meet.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <ios>

#include "gpu_test_util.h"
#include "kernels/device_util.cuh"

namespace {

struct Mismatch {
  unsigned long long count;
  uint32_t first_bits;  // the lowest failing bit pattern (0xffffffff: none)
};

__device__ void record(Mismatch* m, uint32_t bits) {
  atomicAdd(&m->count, 1ull);
  atomicMin(&m->first_bits, bits);
}

// Every float from 0 to 2^38 (the largest fixed-point weight), bit pattern by
// bit pattern: round_nonneg_to_u64 against __float2ull_rn.
__global__ void weight_rounding_kernel(uint32_t last_bits, Mismatch* m) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i <= last_bits;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const float y = __uint_as_float(static_cast<uint32_t>(i));
    if (ssa::cuda::round_nonneg_to_u64(y) != __float2ull_rn(y)) record(m, static_cast<uint32_t>(i));
  }
}

// Every 32-bit pattern (negative, infinite and NaN included): the histogram bin
// against the truncating conversion it replaces.
__global__ void score_bin_kernel(Mismatch* m) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i <= 0xffffffffull;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const float f = __uint_as_float(static_cast<uint32_t>(i));
    constexpr uint32_t last = ssa::cuda::kScoreBins - 1;
    const uint32_t want = f < static_cast<float>(last) ? __float2uint_rz(f) : last;
    if (ssa::cuda::score_bin_of_distance(f) != want) record(m, static_cast<uint32_t>(i));
  }
}

Mismatch run(void (*launch)(Mismatch*)) {
  Mismatch* d = nullptr;
  REQUIRE(cudaMalloc(&d, sizeof(Mismatch)) == cudaSuccess);
  const Mismatch none{0, 0xffffffffu};
  REQUIRE(cudaMemcpy(d, &none, sizeof none, cudaMemcpyHostToDevice) == cudaSuccess);
  launch(d);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  Mismatch h{};
  REQUIRE(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(d);
  return h;
}

}  // namespace

TEST_CASE("gpu fixed-point weights and histogram bins equal the conversion instructions on every input") {
  SSA_GPU_TEST_OR_SKIP();
  // 2^38 as a float: 0x4C800000.
  const Mismatch w = run([](Mismatch* d) { weight_rounding_kernel<<<2048, 256>>>(0x4C800000u, d); });
  CHECK_MESSAGE(w.count == 0, "weight rounding differs first at bits 0x" << std::hex << w.first_bits);
  const Mismatch b = run([](Mismatch* d) { score_bin_kernel<<<2048, 256>>>(d); });
  CHECK_MESSAGE(b.count == 0, "score bin differs first at bits 0x" << std::hex << b.first_bits);
}
