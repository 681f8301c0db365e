// The structured workload of the tiered benchmark (bench/gpu_tier_bench.cu),
// generated on the device: every KV head has kTopics random directions; the
// tokens come in bursts of kBurst consecutive tokens on one topic (a document,
// a tool result), their keys near that topic's direction; values are noise. A
// query is near a few topics of its KV head, with fresh noise every step, so
// its heavy set lies in the bursts of those topics and moves a little from
// step to step, and its topics change every kTopicSteps steps.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <random>
#include <vector>

namespace ssa_bench {

constexpr uint32_t kTopics = 64, kBurst = 512, kQueryTopics = 3, kTopicSteps = 64;
constexpr float kKeyScale = 0.7f, kQueryScale = 0.7f, kQueryNoise = 0.3f;

__device__ __host__ inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ inline float normal_at(uint64_t key) {
  const uint64_t h = mix64(key);
  const float u1 = ((h >> 40) + 1) * (1.0f / 16777217.0f), u2 = ((h & 0xFFFFFF) + 0.5f) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__device__ __host__ inline uint32_t burst_topic(uint64_t seed, uint32_t session, uint32_t kv_head, uint64_t token) {
  return static_cast<uint32_t>(mix64(seed ^ (uint64_t{session} << 48) ^ (uint64_t{kv_head} << 40) ^ (token / kBurst)) %
                               kTopics);
}

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Token-major [m][nkv][d] rows of tokens [t0, t0 + m).
template <typename T>
__global__ void generate_kv_kernel(T* k, T* v, const float* dirs, uint64_t seed, uint32_t session, uint64_t t0,
                                   uint64_t m, uint32_t nkv, uint32_t d) {
  const uint64_t total = m * nkv * d;
  const float scale = kKeyScale * sqrtf(static_cast<float>(d));
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < total; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t j = i % d, h = (i / d) % nkv;
    const uint64_t t = t0 + i / (uint64_t{nkv} * d);
    const uint32_t topic = burst_topic(seed, session, h, t);
    const uint64_t key = seed ^ (uint64_t{session} << 56) ^ ((t * nkv + h) * d + j) * 2;
    k[i] = from_float<T>(scale * dirs[(size_t{h} * kTopics + topic) * d + j] + normal_at(key));
    v[i] = from_float<T>(normal_at(key + 1));
  }
}

class TierWorkload {
 public:
  TierWorkload(uint32_t nq, uint32_t nkv, uint32_t d, bool bf16, uint64_t seed)
      : nq_(nq), nkv_(nkv), d_(d), bf16_(bf16), seed_(seed), dirs_host_(size_t{nkv} * kTopics * d) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (size_t t = 0; t < size_t{nkv} * kTopics; ++t) {
      double norm = 0;
      for (uint32_t j = 0; j < d; ++j) norm += double(dirs_host_[t * d + j] = nd(rng)) * dirs_host_[t * d + j];
      for (uint32_t j = 0; j < d; ++j) dirs_host_[t * d + j] = static_cast<float>(dirs_host_[t * d + j] / sqrt(norm));
    }
    cudaMalloc(&dirs_, dirs_host_.size() * sizeof(float));
    cudaMemcpy(dirs_, dirs_host_.data(), dirs_host_.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~TierWorkload() { cudaFree(dirs_); }
  TierWorkload(const TierWorkload&) = delete;
  TierWorkload& operator=(const TierWorkload&) = delete;

  // K and V (device, token-major) of tokens [t0, t0 + m) of session `session`.
  void generate(uint32_t session, uint64_t t0, uint64_t m, void* k, void* v) const {
    const uint32_t blocks = 1024, threads = 256;
    if (bf16_) {
      generate_kv_kernel<<<blocks, threads>>>(static_cast<__nv_bfloat16*>(k), static_cast<__nv_bfloat16*>(v), dirs_,
                                              seed_, session, t0, m, nkv_, d_);
    } else {
      generate_kv_kernel<<<blocks, threads>>>(static_cast<__half*>(k), static_cast<__half*>(v), dirs_, seed_, session,
                                              t0, m, nkv_, d_);
    }
  }

  // The queries of sessions 0..count-1 at `step` into q (device, [count][nq][d]).
  void queries(uint64_t step, uint32_t count, void* q) const {
    const uint32_t g = nq_ / nkv_;
    std::vector<uint16_t> bits(size_t{count} * nq_ * d_);
    std::mt19937_64 rng(mix64(seed_ ^ step));
    std::normal_distribution<float> nd(0.f, 1.f);
    const float scale = kQueryScale * sqrtf(static_cast<float>(d_) / kQueryTopics);
    for (uint32_t s = 0; s < count; ++s)
      for (uint32_t h = 0; h < nq_; ++h) {
        const uint32_t kvh = h / g;
        for (uint32_t j = 0; j < d_; ++j) {
          float x = 0.f;
          for (uint32_t c = 0; c < kQueryTopics; ++c) {
            const uint32_t topic = static_cast<uint32_t>(
                mix64(seed_ ^ (uint64_t{s} << 32) ^ (uint64_t{kvh} << 24) ^ (uint64_t{c} << 16) ^ (step / kTopicSteps)) %
                kTopics);
            x += scale * dirs_host_[(size_t{kvh} * kTopics + topic) * d_ + j];
          }
          x += kQueryNoise * nd(rng);
          bits[(size_t{s} * nq_ + h) * d_ + j] = bf16_ ? to_bf16(x) : to_f16(x);
        }
      }
    cudaMemcpy(q, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  }

 private:
  static uint16_t to_f16(float x) {
    const __half h = __float2half_rn(x);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
  }
  static uint16_t to_bf16(float x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
  }
  uint32_t nq_, nkv_, d_;
  bool bf16_;
  uint64_t seed_;
  std::vector<float> dirs_host_;
  float* dirs_ = nullptr;
};

}  // namespace ssa_bench
