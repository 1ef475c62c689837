// Private to io/: the integrity header in the user block (io/checkpoint_header.cpp;
// layout in docs/checkpoint-format.md, section 1.1).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/aligned_bytes.h"

namespace engine {
namespace checkpoint_internal {

// The checksums a header records: of the first metadata_bytes of the payload, and of all
// of it.
struct PayloadChecksums {
  std::size_t metadata_bytes = 0;
  uint32_t metadata_crc = 0, payload_crc = 0;
};
PayloadChecksums checksums_of(const unsigned char* payload, std::size_t payload_bytes, std::size_t metadata_bytes);
// Fills the user block of `image` (layout in docs/checkpoint-format.md, section 1.1).
// Version 1 headers have no metadata lines; tests write them to stand for old files.
void seal_with(Bytes& image, int64_t format_version, const PayloadChecksums& sums);
// Seals with all of the payload counted as metadata: right for any file.
void seal(Bytes& image, int64_t format_version);

struct Header {
  int64_t format_version = 0;
  std::size_t payload_bytes = 0, metadata_bytes = 0;  // version 1: all of the payload is metadata
  uint32_t payload_crc = 0, metadata_crc = 0;
};
// Everything about the header before any payload byte is trusted: magic, header
// checksum, version, fields, length, in that order so each refusal names the real
// problem. `file` holds the first min(size, 512) bytes of a file of `size` bytes; the
// payload checksums are checked by the caller as the payload is read.
Header parse_header(const std::string& path, const unsigned char* file, std::size_t size);

uint32_t crc_join(uint32_t first, uint32_t second, std::size_t second_bytes);
void check_checksum(const std::string& path, const char* what, uint32_t actual, uint32_t recorded);

}  // namespace checkpoint_internal
}  // namespace engine
