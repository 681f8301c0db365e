// Synthetic long contexts with the structure real attention has: an attention
// sink, a recency bias, keys clustered by topic, values that correlate with their
// topic, topics arriving in bursts, and a query that prefers a few topics while
// the rest keeps a heavy tail. Used by tests, benchmarks and the main example;
// only the public header's conventions are assumed (token-major K/V).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <random>
#include <vector>

namespace ssa_test {

struct StructuredContext {
  size_t n = 0, n_kv = 0, n_q = 0, d = 0;
  std::vector<float> K, V;  // [n][n_kv][d]
  std::vector<float> q;     // [n_q][d]
};

struct StructuredOptions {
  size_t n_topics = 96;
  double key_scale = 1.0;     // norm of topic centres relative to sqrt(d)
  double key_noise = 0.55;    // per-token deviation from the topic centre
  double value_noise = 0.6;
  double query_focus = 6.0;   // logit of a token of the query's first topic
  size_t burst_min = 32, burst_max = 512;
  uint64_t seed = 7;
};

inline StructuredContext make_structured_context(size_t n, size_t n_kv, size_t n_q, size_t d,
                                                 const StructuredOptions& o = {}) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  StructuredContext c;
  c.n = n;
  c.n_kv = n_kv;
  c.n_q = n_q;
  c.d = d;
  c.K.resize(n * n_kv * d);
  c.V.resize(n * n_kv * d);
  c.q.resize(n_q * d);
  const size_t T = o.n_topics;
  // Topic centres for keys and values, per KV head.
  std::vector<double> kc(n_kv * T * d), vc(n_kv * T * d);
  for (auto& x : kc) x = gauss(rng) * o.key_scale;
  for (auto& x : vc) x = gauss(rng);
  // Topic sequence in bursts; token 0 is a sink with its own direction.
  std::vector<uint32_t> topic(n);
  std::uniform_int_distribution<size_t> burst(o.burst_min, o.burst_max);
  std::uniform_int_distribution<uint32_t> pick(0, static_cast<uint32_t>(T - 1));
  for (size_t t = 0; t < n;) {
    const size_t len = burst(rng);
    const uint32_t tp = pick(rng);
    for (size_t i = 0; i < len && t < n; ++i) topic[t++] = tp;
  }
  for (size_t t = 0; t < n; ++t) {
    for (size_t h = 0; h < n_kv; ++h) {
      const double* kcen = &kc[(h * T + topic[t]) * d];
      const double* vcen = &vc[(h * T + topic[t]) * d];
      float* k = &c.K[(t * n_kv + h) * d];
      float* v = &c.V[(t * n_kv + h) * d];
      for (size_t j = 0; j < d; ++j) {
        k[j] = static_cast<float>(kcen[j] + o.key_noise * gauss(rng));
        v[j] = static_cast<float>(vcen[j] + o.value_noise * gauss(rng));
      }
      if (t == 0) {
        for (size_t j = 0; j < d; ++j) k[j] = static_cast<float>(3.0 * kc[h * T * d + j]);
      }
    }
  }
  // Queries: a mix of three topics of their KV head plus noise. The logit of a
  // token of a preferred topic is about query_focus * sqrt(d) * weight / sqrt(d).
  const size_t g = n_q / n_kv;
  for (size_t h = 0; h < n_q; ++h) {
    const size_t kv = h / g;
    const uint32_t a = pick(rng), b = pick(rng), e = pick(rng);
    for (size_t j = 0; j < d; ++j) {
      const double mix = 1.0 * kc[(kv * T + a) * d + j] + 0.7 * kc[(kv * T + b) * d + j] +
                         0.5 * kc[(kv * T + e) * d + j];
      c.q[h * d + j] = static_cast<float>(o.query_focus * mix / sqrt(static_cast<double>(d)) +
                                          0.3 * gauss(rng) / sqrt(static_cast<double>(d)));
    }
  }
  return c;
}

}  // namespace ssa_test
