// The checkpoint checksum must be zlib's CRC-32 bit for bit (the format says so, and
// Python's zlib.crc32 checks files written by the engine), whichever path computes it.
#include <doctest/doctest.h>
#include <zlib.h>

#include <random>
#include <vector>

#include "io/crc32.h"

TEST_CASE("crc32_update equals zlib's crc32 for every length and seed") {
  std::mt19937 g(7);
  std::vector<unsigned char> buf(9 << 20);
  for (auto& c : buf) c = static_cast<unsigned char>(g());
  std::vector<std::size_t> lengths = {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4096, 65537};
  for (std::size_t i = 0; i < 200; ++i) lengths.push_back(g() % 20000);
  lengths.push_back(5316248);
  lengths.push_back(buf.size());
  for (std::size_t n : lengths)
    for (uint32_t init : {0u, 1u, 0xdeadbeefu}) {
      CAPTURE(n);
      CAPTURE(init);
      const uint32_t want = static_cast<uint32_t>(crc32(init, buf.data() + 3, static_cast<uInt>(std::min(n, buf.size() - 3))));
      CHECK(engine::crc32_update(init, buf.data() + 3, std::min(n, buf.size() - 3)) == want);
    }
}
