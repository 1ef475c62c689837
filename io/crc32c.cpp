#include "io/crc32c.h"

#include <array>

namespace engine {

namespace {

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32c_update(uint32_t crc, const unsigned char* data, std::size_t n) {
  // Event files are a few kilobytes: a byte-wise table is fast enough.
  static const std::array<uint32_t, 256> table = make_table();
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32c_masked(const unsigned char* data, std::size_t n) {
  const uint32_t crc = crc32c_update(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace engine
