// Float32 arrays as base64 text and back (export_base64.h).
#include "train/export_base64.h"

#include <cstdint>
#include <cstring>

#include "engine/train/export.h"

namespace engine {
namespace export_internal {

namespace {

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_floats(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());  // little-endian float32
  const size_t n = v.size() * sizeof(float);
  std::string out;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t chunk = static_cast<uint32_t>(p[i]) << 16;
    if (i + 1 < n) chunk |= static_cast<uint32_t>(p[i + 1]) << 8;
    if (i + 2 < n) chunk |= p[i + 2];
    out += kBase64[(chunk >> 18) & 63];
    out += kBase64[(chunk >> 12) & 63];
    out += i + 1 < n ? kBase64[(chunk >> 6) & 63] : '=';
    out += i + 2 < n ? kBase64[chunk & 63] : '=';
  }
  return out;
}

std::vector<float> floats_from_base64(const std::string& text, size_t count, const std::string& origin,
                                      const std::string& key) {
  const auto fail = [&] {
    return ExportError(origin + ": metadata " + key + " is not base64 of " + std::to_string(count) + " float32 values");
  };
  if (text.size() % 4 != 0 || text.size() / 4 * 3 < count * 4 || text.size() / 4 * 3 > count * 4 + 2) throw fail();
  std::vector<unsigned char> bytes;
  bytes.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t chunk = 0;
    int pads = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* at = c ? std::strchr(kBase64, c) : nullptr;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pads;
        chunk <<= 6;
        continue;
      }
      if (!at || pads) throw fail();
      chunk = (chunk << 6) | static_cast<uint32_t>(at - kBase64);
    }
    bytes.push_back(static_cast<unsigned char>(chunk >> 16));
    if (pads < 2) bytes.push_back(static_cast<unsigned char>(chunk >> 8));
    if (pads < 1) bytes.push_back(static_cast<unsigned char>(chunk));
  }
  if (bytes.size() != count * 4) throw fail();
  std::vector<float> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace export_internal
}  // namespace engine
