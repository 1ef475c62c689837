// The integrity header in the user block: sealing on save, every check on load
// (docs/checkpoint-format.md, section 1.1).
#include "io/checkpoint_format.h"
#include "io/checkpoint_header.h"
#include "io/number_text.h"
#include <zlib.h>

#include <algorithm>
#include <sstream>

#include "io/crc32.h"

namespace engine {
namespace checkpoint_internal {
namespace {

bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoull(s);
  return true;
}

bool parse_hex32(const std::string& s, uint32_t& out) {
  if (s.size() != 8 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  out = static_cast<uint32_t>(std::stoul(s, nullptr, 16));
  return true;
}

int bit_distance(const unsigned char* a, const char* b, std::size_t n) {
  int bits = 0;
  for (std::size_t i = 0; i < n; ++i) bits += __builtin_popcount(static_cast<unsigned>(a[i] ^ static_cast<unsigned char>(b[i])));
  return bits;
}


}  // namespace

// ---------------------------------------------------------------------------------
// The integrity header in the user block (layout in docs/checkpoint-format.md).

PayloadChecksums checksums_of(const unsigned char* payload, std::size_t payload_bytes, std::size_t metadata_bytes) {
  PayloadChecksums sums;
  sums.metadata_bytes = metadata_bytes;
  sums.metadata_crc = crc32_update(0, payload, metadata_bytes);
  const uint32_t data_crc = crc32_update(0, payload + metadata_bytes, payload_bytes - metadata_bytes);
  sums.payload_crc = static_cast<uint32_t>(
      crc32_combine(sums.metadata_crc, data_crc, static_cast<z_off_t>(payload_bytes - metadata_bytes)));
  return sums;
}

// Fills the user block of `image` (layout in docs/checkpoint-format.md, section 1.1).
// Version 1 headers have no metadata lines; tests write them to stand for old files.
void seal_with(Bytes& image, int64_t format_version, const PayloadChecksums& sums) {
  const std::size_t payload = image.size() - kUserBlockBytes;
  std::string text = kMagic;
  text += "format_version " + std::to_string(format_version) + "\n";
  text += "userblock_bytes " + std::to_string(kUserBlockBytes) + "\n";
  text += "payload_bytes " + std::to_string(payload) + "\n";
  if (format_version >= 2) {
    text += "metadata_bytes " + std::to_string(sums.metadata_bytes) + "\n";
    text += "metadata_crc32 " + hex32(sums.metadata_crc) + "\n";
  }
  text += "payload_crc32 " + hex32(sums.payload_crc) + "\n";
  text += "header_crc32 " + hex32(crc32_update(0, reinterpret_cast<const unsigned char*>(text.data()), text.size())) + "\n";
  std::fill(image.begin(), image.begin() + kUserBlockBytes, 0);
  std::copy(text.begin(), text.end(), image.begin());
}

// Seals with all of the payload counted as metadata: right for any file.
void seal(Bytes& image, int64_t format_version) {
  const std::size_t payload = image.size() - kUserBlockBytes;
  seal_with(image, format_version, checksums_of(image.data() + kUserBlockBytes, payload, payload));
}


// Everything about the header before any payload byte is trusted: magic, header
// checksum, version, fields, length, in that order so each refusal names the real
// problem. `file` holds the first min(size, 512) bytes of a file of `size` bytes; the
// payload checksums are checked by the caller as the payload is read.
Header parse_header(const std::string& path, const unsigned char* file, std::size_t size) {
  if (size == 0) fail(path, "truncated: the file is empty");
  if (std::memcmp(file, kMagic, std::min(size, kMagicBytes)) != 0) {
    if (size >= 8 && std::memcmp(file, kHdf5Signature, 8) == 0)
      fail(path, "not an engine checkpoint: a plain HDF5 file without the engine header");
    // One or two flipped bits in the magic are damage, not a foreign file.
    if (size >= kMagicBytes && bit_distance(file, kMagic, kMagicBytes) <= 2)
      fail(path, corrupt("damaged magic at the start of the file"));
    fail(path, "not an engine checkpoint (wrong magic; expected a file written by save_checkpoint)");
  }
  if (size < kUserBlockBytes)
    fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(kUserBlockBytes) + "-byte header");

  const unsigned char* block = file;
  const std::size_t text_end = std::find(block, block + kUserBlockBytes, 0) - block;
  for (std::size_t i = text_end; i < kUserBlockBytes; ++i)
    if (block[i] != 0) fail(path, corrupt("non-zero byte at offset " + std::to_string(i) + " of the header padding"));
  const std::string text(reinterpret_cast<const char*>(block), text_end);
  if (text.empty() || text.back() != '\n') fail(path, corrupt("header text is not terminated"));
  const std::size_t last = text.rfind('\n', text.size() - 2) + 1;
  const std::string crc_line = text.substr(last, text.size() - 1 - last);
  uint32_t header_crc = 0;
  if (crc_line.compare(0, 13, "header_crc32 ") != 0 || !parse_hex32(crc_line.substr(13), header_crc))
    fail(path, corrupt("header has no valid header_crc32 line"));
  const uint32_t actual_header_crc = crc32_update(0, block, last);
  if (actual_header_crc != header_crc)
    fail(path, corrupt("header crc32 is " + hex32(actual_header_crc) + ", recorded " + hex32(header_crc)));

  std::map<std::string, std::string> fields;
  std::istringstream lines(text.substr(kMagicBytes, last - kMagicBytes));
  for (std::string line; std::getline(lines, line);) {
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || !fields.emplace(line.substr(0, space), line.substr(space + 1)).second)
      fail(path, corrupt("malformed header line '" + line + "'"));
  }
  uint64_t version = 0;
  if (!fields.count("format_version") || !parse_u64(fields["format_version"], version))
    fail(path, corrupt("header has no valid format_version"));
  if (version > static_cast<uint64_t>(kCheckpointFormatVersion))
    fail(path, "format_version " + std::to_string(version) + " is newer than this engine supports (" +
                   std::to_string(kCheckpointFormatVersion) + "); upgrade the engine");
  if (version < 1) fail(path, "format_version " + std::to_string(version) + " is not a valid version");

  uint64_t userblock = 0, payload = 0;
  uint32_t payload_crc = 0;
  if (!fields.count("userblock_bytes") || !parse_u64(fields["userblock_bytes"], userblock) ||
      userblock != kUserBlockBytes || !fields.count("payload_bytes") || !parse_u64(fields["payload_bytes"], payload) ||
      !fields.count("payload_crc32") || !parse_hex32(fields["payload_crc32"], payload_crc))
    fail(path, corrupt("header lacks userblock_bytes, payload_bytes or payload_crc32"));
  const uint64_t expected = kUserBlockBytes + payload;
  if (size < expected)
    fail(path, "truncated: " + std::to_string(size) + " bytes, the header records " + std::to_string(expected));
  if (size > expected)
    fail(path, "length mismatch (file is corrupt): " + std::to_string(size) + " bytes, the header records " +
                   std::to_string(expected));
  Header h;
  h.format_version = static_cast<int64_t>(version);
  h.payload_bytes = static_cast<std::size_t>(payload);
  h.payload_crc = payload_crc;
  h.metadata_bytes = h.payload_bytes;
  h.metadata_crc = payload_crc;
  if (version >= 2) {
    uint64_t metadata = 0;
    if (!fields.count("metadata_bytes") || !parse_u64(fields["metadata_bytes"], metadata) || metadata > payload ||
        !fields.count("metadata_crc32") || !parse_hex32(fields["metadata_crc32"], h.metadata_crc))
      fail(path, corrupt("header lacks a valid metadata_bytes or metadata_crc32"));
    h.metadata_bytes = static_cast<std::size_t>(metadata);
  }
  return h;
}

uint32_t crc_join(uint32_t first, uint32_t second, std::size_t second_bytes) {
  return static_cast<uint32_t>(crc32_combine(first, second, static_cast<z_off_t>(second_bytes)));
}

void check_checksum(const std::string& path, const char* what, uint32_t actual, uint32_t recorded) {
  if (actual != recorded)
    fail(path, corrupt(std::string("crc32 of the HDF5 ") + what + " is " + hex32(actual) + ", recorded " + hex32(recorded)));
}


}  // namespace checkpoint_internal

}  // namespace engine
