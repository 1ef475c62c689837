// Private to the export (engine/train/export*.cpp): float32 arrays as base64 text, how
// the probes travel in an export's metadata.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace engine {
namespace export_internal {

// Base64 of the little-endian float32 bytes of `v`.
std::string base64_floats(const std::vector<float>& v);

// Exactly `count` float32 values, or an ExportError naming the key.
std::vector<float> floats_from_base64(const std::string& text, size_t count, const std::string& origin,
                                      const std::string& key);

}  // namespace export_internal
}  // namespace engine
