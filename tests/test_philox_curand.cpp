// engine::philox_at against cuRAND's own Philox4x32-10 code, compiled for the host.
//
// curand_philox4x32_x.h is host-compilable (NV_IF_ELSE_TARGET picks a host mulhilo)
// once QUALIFIERS is defined without __device__. We reproduce curand_init(seed,
// subsequence, offset) + curand() for curandStatePhilox4_32_10_t statement for statement
// as curand_kernel.h writes them, calling the header's own Philox_State_Incr,
// Philox_State_Incr_hi and curand_Philox4x32_10, and compare long runs of outputs with
// philox_at(PhiloxStream{seed, subsequence}, offset + j).
//
// The header needs the CUDA include directory on the include path (it includes
// <nv/target>): CUDA builds get it through CUDA::cudart_static, which the engine library
// links publicly. Elsewhere (CPU-only builds, no toolkit) the test case is compiled but
// marked skipped, so the report says so instead of passing vacuously.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "engine/kernels/philox.h"

#if __has_include(<curand_philox4x32_x.h>) && __has_include(<vector_types.h>)
#define ENGINE_TEST_HAVE_CURAND_PHILOX 1
#define QUALIFIERS static inline
#include <vector_types.h>
#include <curand_philox4x32_x.h>
#elif __has_include("/usr/local/cuda/include/curand_philox4x32_x.h") && __has_include(<nv/target>)
#define ENGINE_TEST_HAVE_CURAND_PHILOX 1
#define QUALIFIERS static inline
#include "/usr/local/cuda/include/vector_types.h"
#include "/usr/local/cuda/include/curand_philox4x32_x.h"
#else
#define ENGINE_TEST_HAVE_CURAND_PHILOX 0
#endif

#if ENGINE_TEST_HAVE_CURAND_PHILOX

namespace {

// curand_kernel.h: skipahead_sequence(n, state).
void curand_skipahead_sequence(unsigned long long n, curandStatePhilox4_32_10_t* state) {
  Philox_State_Incr_hi(state, n);
  state->output = curand_Philox4x32_10(state->ctr, state->key);
}

// curand_kernel.h: skipahead(n, state).
void curand_skipahead(unsigned long long n, curandStatePhilox4_32_10_t* state) {
  state->STATE += (n & 3);
  n /= 4;
  if (state->STATE > 3) {
    n += 1;
    state->STATE -= 4;
  }
  Philox_State_Incr(state, n);
  state->output = curand_Philox4x32_10(state->ctr, state->key);
}

// curand_kernel.h: curand_init(seed, subsequence, offset, state) for Philox4_32_10.
void curand_init_philox(unsigned long long seed, unsigned long long subsequence,
                        unsigned long long offset, curandStatePhilox4_32_10_t* state) {
  state->ctr.x = state->ctr.y = state->ctr.z = state->ctr.w = 0;
  state->key.x = static_cast<unsigned int>(seed);
  state->key.y = static_cast<unsigned int>(seed >> 32);
  state->STATE = 0;
  state->boxmuller_flag = 0;
  state->boxmuller_flag_double = 0;
  state->boxmuller_extra = 0.f;
  state->boxmuller_extra_double = 0.;
  curand_skipahead_sequence(subsequence, state);
  curand_skipahead(offset, state);
}

// curand_kernel.h: curand(state) for Philox4_32_10.
unsigned int curand_next(curandStatePhilox4_32_10_t* state) {
  unsigned int ret;
  switch (state->STATE++) {
    default: ret = state->output.x; break;
    case 1: ret = state->output.y; break;
    case 2: ret = state->output.z; break;
    case 3: ret = state->output.w; break;
  }
  if (state->STATE == 4) {
    Philox_State_Incr(state);
    state->output = curand_Philox4x32_10(state->ctr, state->key);
    state->STATE = 0;
  }
  return ret;
}

}  // namespace

#define CURAND_DECORATOR
#else
#define CURAND_DECORATOR * doctest::skip()
#endif

TEST_CASE("philox_at equals cuRAND's curand_init + curand sequence" CURAND_DECORATOR) {
#if ENGINE_TEST_HAVE_CURAND_PHILOX
  struct Triple {
    uint64_t seed, subsequence, offset;
  };
  const Triple triples[] = {
      {0, 0, 0},
      {42, 0, 0},
      {42, 1, 0},
      {42, 3, 1},                                            // the engine's dropout stream
      {0x0123456789abcdefull, 2, 7},                         // seed > 2^32, offset % 4 == 3
      {0xffffffffffffffffull, 5, 2},                         // all-ones seed
      {1234, (1ull << 32) + 7, 5},                           // subsequence > 2^32
      {0x9e3779b97f4a7c15ull, 0xfedcba9876543210ull, 123457},  // both large, odd offset
      {7, 1, (1ull << 32) + 3},                              // offset past 2^32 (counter word 1)
      {7, 2, 0xfffffffffffffffull - 1000},                   // counter words near their top
  };
  for (const Triple& t : triples) {
    CAPTURE(t.seed);
    CAPTURE(t.subsequence);
    CAPTURE(t.offset);
    curandStatePhilox4_32_10_t state;
    curand_init_philox(t.seed, t.subsequence, t.offset, &state);
    const engine::PhiloxStream stream{t.seed, t.subsequence};
    int mismatches = 0;
    int64_t first = -1;
    for (uint64_t j = 0; j < 1100; ++j) {
      const unsigned int want = curand_next(&state);
      if (engine::philox_at(stream, t.offset + j) != want) {
        if (mismatches++ == 0) first = static_cast<int64_t>(j);
      }
    }
    CAPTURE(first);
    CHECK(mismatches == 0);
  }
#endif
}

TEST_CASE("cuRAND's Philox4x32-10 block function gives the Random123 known answers" CURAND_DECORATOR) {
#if ENGINE_TEST_HAVE_CURAND_PHILOX
  // Confirms the host build of the header computes the real function (not a stub).
  uint4 c;
  c.x = c.y = c.z = c.w = 0;
  uint2 k;
  k.x = k.y = 0;
  const uint4 r = curand_Philox4x32_10(c, k);
  CHECK(r.x == 0x6627e8d5u);
  CHECK(r.y == 0xe169c58du);
  CHECK(r.z == 0xbc57ac4cu);
  CHECK(r.w == 0x9b00dbd8u);
  c.x = 0x243f6a88u, c.y = 0x85a308d3u, c.z = 0x13198a2eu, c.w = 0x03707344u;
  k.x = 0xa4093822u, k.y = 0x299f31d0u;
  const uint4 r2 = curand_Philox4x32_10(c, k);
  const engine::Philox4x32 e = engine::philox4x32_10({{c.x, c.y, c.z, c.w}}, k.x, k.y);
  CHECK(r2.x == 0xd16cfe09u);
  CHECK(r2.y == 0x94fdccebu);
  CHECK(r2.z == 0x5001e420u);
  CHECK(r2.w == 0x24126ea1u);
  CHECK(e.v[0] == r2.x);
  CHECK(e.v[1] == r2.y);
  CHECK(e.v[2] == r2.z);
  CHECK(e.v[3] == r2.w);
#endif
}
