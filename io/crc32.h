// CRC-32 exactly as zlib's crc32() computes it (IEEE 802.3 polynomial, reflected), at
// memory speed: carry-less-multiply folding where the CPU has PCLMULQDQ, zlib itself
// for the rest. Callers spread large buffers over threads and join the pieces with
// zlib's crc32_combine (io/checkpoint_reader.cpp and io/checkpoint_header.cpp do).
#pragma once
#include <cstddef>
#include <cstdint>

namespace engine {

// crc32(crc, data, n) of zlib, single thread.
uint32_t crc32_update(uint32_t crc, const unsigned char* data, std::size_t n);

}  // namespace engine
