// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// written once for host and device. The stream layout is cuRAND's: for
// curand_init(seed, subsequence, offset), the key is the seed's low/high 32 bits,
// the subsequence sits in counter words 2-3, and the offset counts 32-bit outputs.
// So value j of stream (seed, subsequence) is word j%4 of
// philox({j/4 lo, j/4 hi, subsequence lo, subsequence hi}, key): random access, no state.
#pragma once
#include <cstdint>

#include "engine/kernels/hd.h"

namespace engine {

struct Philox4x32 {
  uint32_t v[4];
};

ENGINE_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// The raw 10-round bijection on a 128-bit counter with a 64-bit key.
ENGINE_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c.v[0], &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c.v[2], &hi1, &lo1);
    Philox4x32 n;
    n.v[0] = hi1 ^ c.v[1] ^ k0;
    n.v[1] = lo1;
    n.v[2] = hi0 ^ c.v[3] ^ k1;
    n.v[3] = lo0;
    c = n;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// One named stream of the generator: the seed and the stream's subsequence number.
struct PhiloxStream {
  uint64_t seed = 0;
  uint64_t subsequence = 0;
};

// The 32-bit output at position `index` of a stream (cuRAND's curand() sequence).
ENGINE_HD uint32_t philox_at(PhiloxStream s, uint64_t index) {
  const uint64_t block = index >> 2;
  Philox4x32 c;
  c.v[0] = static_cast<uint32_t>(block);
  c.v[1] = static_cast<uint32_t>(block >> 32);
  c.v[2] = static_cast<uint32_t>(s.subsequence);
  c.v[3] = static_cast<uint32_t>(s.subsequence >> 32);
  const Philox4x32 r = philox4x32_10(c, static_cast<uint32_t>(s.seed),
                                     static_cast<uint32_t>(s.seed >> 32));
  return r.v[index & 3];
}

// Uniform float in [0, 1) with 24 random bits (exactly representable).
ENGINE_HD float philox_uniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace engine
