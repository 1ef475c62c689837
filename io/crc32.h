// CRC-32 exactly as zlib's crc32() computes it (IEEE 802.3 polynomial, reflected), at
// memory speed: carry-less-multiply folding where the CPU has PCLMULQDQ, slices on all
// cores joined with crc32_combine, zlib itself for the rest.
#pragma once
#include <cstddef>
#include <cstdint>

namespace engine {

// crc32(crc, data, n) of zlib, single thread.
uint32_t crc32_update(uint32_t crc, const unsigned char* data, std::size_t n);
// crc32(0, data, n) of zlib, spread over the OpenMP threads for large buffers.
uint32_t crc32_parallel(const unsigned char* data, std::size_t n);

}  // namespace engine
