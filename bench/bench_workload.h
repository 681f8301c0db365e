// Fast structured KV for benchmarks (millions of tokens): keys are topic centres
// plus noise, topics arrive in bursts, values correlate with topics. Noise comes
// from a precomputed Gaussian table so generating 1M tokens takes about a second.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <random>
#include <vector>

#include "common/dtype.h"

namespace ssa_bench {

class StructuredKv {
 public:
  StructuredKv(uint32_t n_kv, uint32_t d, uint64_t seed, uint32_t topics = 256)
      : n_kv_(n_kv), d_(d), topics_(topics), rng_(seed) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    kc_.resize(size_t{n_kv} * topics * d);
    vc_.resize(kc_.size());
    for (auto& x : kc_) x = g(rng_);
    for (auto& x : vc_) x = g(rng_);
    noise_.resize(1 << 16);
    for (auto& x : noise_) x = 0.5f * g(rng_);
  }

  // Fills K and V ([n][n_kv][d], dtype t) with the next n tokens.
  void next(size_t n, ssa::DType t, std::vector<uint8_t>* K, std::vector<uint8_t>* V) {
    const size_t per = size_t{n_kv_} * d_;
    K->resize(n * per * ssa::dtype_bytes(t));
    V->resize(K->size());
    for (size_t i = 0; i < n; ++i) {
      if (burst_left_ == 0) {
        topic_ = static_cast<uint32_t>(rng_() % topics_);
        burst_left_ = 32 + rng_() % 480;
      }
      --burst_left_;
      for (uint32_t h = 0; h < n_kv_; ++h) {
        const float* kc = &kc_[(size_t{h} * topics_ + topic_) * d_];
        const float* vc = &vc_[(size_t{h} * topics_ + topic_) * d_];
        uint32_t r = static_cast<uint32_t>(rng_());
        for (uint32_t j = 0; j < d_; ++j) {
          const size_t idx = (i * n_kv_ + h) * d_ + j;
          ssa::store_from_f32(K->data(), t, idx, kc[j] + noise_[(r + j * 40503u) & 0xffff]);
          ssa::store_from_f32(V->data(), t, idx, vc[j] + noise_[(r * 7u + j * 2654435761u) & 0xffff]);
        }
      }
    }
  }

  // A query for each q head (group g): a mix of topics, logit scale ~6.
  std::vector<float> query(uint32_t n_q) {
    std::vector<float> q(size_t{n_q} * d_);
    const uint32_t g = n_q / n_kv_;
    for (uint32_t h = 0; h < n_q; ++h) {
      const uint32_t kv = h / g, a = rng_() % topics_, b = rng_() % topics_;
      for (uint32_t j = 0; j < d_; ++j) {
        q[size_t{h} * d_ + j] = (6.0f * kc_[(size_t{kv} * topics_ + a) * d_ + j] +
                                 4.0f * kc_[(size_t{kv} * topics_ + b) * d_ + j]) /
                                std::sqrt(static_cast<float>(d_));
      }
    }
    return q;
  }

 private:
  uint32_t n_kv_, d_, topics_;
  std::mt19937_64 rng_;
  std::vector<float> kc_, vc_, noise_;
  uint32_t topic_ = 0;
  size_t burst_left_ = 0;
};

}  // namespace ssa_bench
