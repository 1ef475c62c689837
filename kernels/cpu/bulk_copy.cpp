#include "kernels/cpu/bulk_copy.h"

#include <cstdint>
#include <cstring>

#include <algorithm>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU
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

}  // namespace engine::kernels::cpu
