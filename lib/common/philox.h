// Philox4x32-10 counter-based RNG (Salmon et al., SC'11). Stateless: the output
// is a pure function of (key, counter), so a draw's randomness depends only on
// (seed, step, layer, head, draw index), never on threads, timing or launch shape.
#pragma once

#include <stdint.h>

#include "host_device.h"

namespace ssa {

struct Philox4 {
  uint32_t v[4];
};

SSA_HD uint32_t philox_mulhi(uint32_t a, uint32_t b, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *lo = static_cast<uint32_t>(p);
  return static_cast<uint32_t>(p >> 32);
}

SSA_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    const uint32_t hi0 = philox_mulhi(kM0, ctr.v[0], &lo0);
    const uint32_t hi1 = philox_mulhi(kM1, ctr.v[2], &lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The stream of one (seed, step, layer, query head). Draw j uses counter j.
struct RngStream {
  uint32_t k0, k1;    // key: the seed
  uint32_t c1, c2, c3;  // counter words fixed for this stream
};

SSA_HD RngStream make_rng_stream(uint64_t seed, uint64_t step, uint32_t layer,
                                 uint32_t head) {
  RngStream s;
  s.k0 = static_cast<uint32_t>(seed);
  s.k1 = static_cast<uint32_t>(seed >> 32);
  s.c1 = static_cast<uint32_t>(step);
  s.c2 = static_cast<uint32_t>(step >> 32) ^ (layer * 0x9E3779B1u);
  s.c3 = head;
  return s;
}

// Four independent 32-bit words for draw `index` of the stream.
SSA_HD Philox4 rng_draw(const RngStream& s, uint32_t index) {
  return philox4x32_10(Philox4{{index, s.c1, s.c2, s.c3}}, s.k0, s.k1);
}

// Uniform in the open interval (0, 1) with 32 bits of resolution.
SSA_HD double rng_uniform(uint32_t word) {
  return (static_cast<double>(word) + 0.5) * (1.0 / 4294967296.0);
}

}  // namespace ssa
