// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of
// TFRecord framing. zlib's crc32 uses a different polynomial, so it has its own table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace engine {

// Continues a running CRC-32C: crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c_update(uint32_t crc, const unsigned char* data, std::size_t n);

// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8, rotated so that
// a CRC of data holding CRCs does not degenerate.
uint32_t crc32c_masked(const unsigned char* data, std::size_t n);

}  // namespace engine
