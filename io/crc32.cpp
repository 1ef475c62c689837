#include "io/crc32.h"

#include <zlib.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace engine {

namespace {

uint32_t zlib_crc32(uint32_t crc, const unsigned char* data, std::size_t n) {
  uLong c = crc;
  // zlib's length is a uInt; feed large buffers in pieces.
  while (n > 0) {
    const std::size_t piece = std::min<std::size_t>(n, std::size_t(1) << 30);
    c = crc32(c, data, static_cast<uInt>(piece));
    data += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(c);
}

#if defined(__x86_64__)
// Folding with carry-less multiplication (Gopal et al., Intel, "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ Instruction", 2009), constants for the
// reflected CRC-32 polynomial 0x04C11DB7 as in Linux's crc32-pclmul: fold by 512 bits
// (k1, k2), by 128 bits (k3, k4), 64 -> 32 bits (k5), then Barrett reduction (P', mu).
__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)),
                       next);
}

__attribute__((target("pclmul,sse4.1"))) uint32_t pclmul_crc32(uint32_t crc, const unsigned char* p,
                                                                std::size_t n) {
  if (n < 64) return zlib_crc32(crc, p, n);
  const __m128i k1k2 = _mm_set_epi64x(0x00000001c6e41596LL, 0x0000000154442bd4LL);
  const __m128i k3k4 = _mm_set_epi64x(0x00000000ccaa009eLL, 0x00000001751997d0LL);
  const __m128i k5 = _mm_set_epi64x(0, 0x0000000163cd6124LL);
  const __m128i poly_mu = _mm_set_epi64x(0x00000001f7011641LL, 0x00000001db710641LL);
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  // (The lambda gets no target attribute; an unaligned load needs only SSE2.)
  auto load = [](const unsigned char* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k1k2, load(p));
    x1 = fold(x1, k1k2, load(p + 16));
    x2 = fold(x2, k1k2, load(p + 32));
    x3 = fold(x3, k1k2, load(p + 48));
  }
  x0 = fold(x0, k3k4, x1);
  x0 = fold(x0, k3k4, x2);
  x0 = fold(x0, k3k4, x3);
  for (; n >= 16; p += 16, n -= 16) x0 = fold(x0, k3k4, load(p));
  __m128i x = _mm_xor_si128(_mm_clmulepi64_si128(x0, k3k4, 0x10), _mm_srli_si128(x0, 8));
  x = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00), _mm_srli_si128(x, 4));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), poly_mu, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
  crc = ~static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x, t), 1));
  return n ? zlib_crc32(crc, p, n) : crc;
}

#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const unsigned char* data, std::size_t n) {
#if defined(__x86_64__)
  static const bool has_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  if (has_pclmul) return pclmul_crc32(crc, data, n);
#endif
  return zlib_crc32(crc, data, n);
}

}  // namespace engine
