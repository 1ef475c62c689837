#include "kernels/cpu/bulk_copy.h"

#include <cstdint>
#include <cstring>

#include <algorithm>

#include "kernels/cpu/cpu_features.h"
#include "kernels/step_digest.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>  // SSE2 (every x86-64 CPU); AVX2 where the CPU has it
#define ENGINE_STREAMING_STORES 1
#endif

namespace engine::kernels::cpu {

namespace {
void copy_one_thread(void* dst, const void* src, std::size_t bytes);
}  // namespace

void copy_bypassing_cache(void* dst, const void* src, std::size_t bytes) {
  // Large copies on the caller's OpenMP threads, 256 KiB each: one core's streaming
  // stores do not use all the memory bandwidth there is.
  constexpr std::size_t kPart = 256 * 1024;
  if (bytes < 4 * kPart) return copy_one_thread(dst, src, bytes);
  const int64_t parts = static_cast<int64_t>((bytes + kPart - 1) / kPart);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    const std::size_t lo = static_cast<std::size_t>(p) * kPart;
    copy_one_thread(static_cast<unsigned char*>(dst) + lo, static_cast<const unsigned char*>(src) + lo,
                    std::min(kPart, bytes - lo));
  }
}

namespace {
void copy_one_thread(void* dst, const void* src, std::size_t bytes) {
#ifdef ENGINE_STREAMING_STORES
  if (bytes >= kStreamingMinBytes) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    // Streaming stores need a 16-byte aligned destination: the head up to it by memcpy.
    const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const std::size_t body = bytes / 64 * 64;
    for (std::size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + body, s + body, bytes - body);
    _mm_sfence();  // streaming stores are weakly ordered: complete them before the handoff
    return;
  }
#endif
  if (bytes) std::memcpy(dst, src, bytes);
}
}  // namespace

namespace {

// The terms of the words of one block, copying them when dst is given; `bytes` a multiple of 4.
uint64_t block_portable(unsigned char* dst, const unsigned char* src, std::size_t bytes, uint64_t first) {
  uint64_t sum = 0;
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    uint32_t w;
    std::memcpy(&w, src + 4 * i, 4);
    sum += digest_term(first + i, w);
  }
  if (dst) std::memcpy(dst, src, bytes);
  return sum;
}

#ifdef ENGINE_STREAMING_STORES
// Eight words a vector, as kernels/cpu's digest of the optimizer (the even and odd lanes'
// products in two accumulators); streaming stores when dst is 32-byte aligned.
__attribute__((target("avx2"))) uint64_t block_avx2(unsigned char* dst, const unsigned char* src, std::size_t bytes,
                                                    uint64_t first) {
  const std::size_t n = bytes / 4, vectors = n / 8;
  const uint32_t k0 = digest_key(first), m = kDigestIndexMultiplier;
  __m256i key = _mm256_setr_epi32(static_cast<int>(k0), static_cast<int>(k0 + m), static_cast<int>(k0 + 2 * m),
                                  static_cast<int>(k0 + 3 * m), static_cast<int>(k0 + 4 * m),
                                  static_cast<int>(k0 + 5 * m), static_cast<int>(k0 + 6 * m),
                                  static_cast<int>(k0 + 7 * m));
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8 * m)), one = _mm256_set1_epi32(1);
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  const bool stream = dst && reinterpret_cast<std::uintptr_t>(dst) % 32 == 0;
  for (std::size_t v = 0; v < vectors; ++v) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * v));
    if (stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32 * v), w);
    else if (dst) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * v), w);
    const __m256i a = _mm256_xor_si256(w, key);
    const __m256i b = _mm256_or_si256(a, one);
    even = _mm256_add_epi64(even, _mm256_mul_epu32(a, b));
    odd = _mm256_add_epi64(odd, _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32)));
    key = _mm256_add_epi32(key, step);
  }
  if (stream) _mm_sfence();  // this thread's streaming stores complete before its block counts as done
  alignas(32) uint64_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), even);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), odd);
  uint64_t sum = 0;
  for (const uint64_t l : lanes) sum += l;
  const std::size_t done = 32 * vectors;
  return sum + block_portable(dst ? dst + done : nullptr, src + done, bytes - done, first + 8 * vectors);
}
#endif

uint64_t copy_digest(unsigned char* dst, const unsigned char* src, std::size_t bytes, uint64_t first_word) {
  static const bool avx2 = cpu_supports(CpuKernels::Avx2);
  constexpr std::size_t kBlock = 256 * 1024;  // a multiple of 32: every block's words start a vector
  const std::size_t whole = bytes / 4 * 4;
  const int64_t blocks = static_cast<int64_t>((whole + kBlock - 1) / kBlock);
  uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const std::size_t lo = static_cast<std::size_t>(b) * kBlock, len = std::min(kBlock, whole - lo);
    unsigned char* d = dst ? dst + lo : nullptr;
#ifdef ENGINE_STREAMING_STORES
    if (avx2) {
      sum += block_avx2(d, src + lo, len, first_word + lo / 4);
      continue;
    }
#endif
    (void)avx2;
    sum += block_portable(d, src + lo, len, first_word + lo / 4);
  }
  if (whole < bytes) {  // the last partial word, padded with zero bytes
    uint32_t w = 0;
    std::memcpy(&w, src + whole, bytes - whole);
    if (dst) std::memcpy(dst + whole, src + whole, bytes - whole);
    sum += digest_term(first_word + whole / 4, w);
  }
  return sum;
}

}  // namespace

uint64_t copy_and_digest(void* dst, const void* src, std::size_t bytes, uint64_t first_word) {
  return copy_digest(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes, first_word);
}

uint64_t digest_bytes(const void* data, std::size_t bytes, uint64_t first_word) {
  return copy_digest(nullptr, static_cast<const unsigned char*>(data), bytes, first_word);
}

}  // namespace engine::kernels::cpu
