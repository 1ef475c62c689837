// libFuzzer harness: the checkpoint header (the 512-byte user block, format section 1.1).
// The input is a small file: a header and at most a few hundred payload bytes. Each input
// goes to the header parser alone (the private io/ entry point parse_header, which the
// loader calls before it trusts any payload byte), then through the public
// verify_checkpoint_file. A dictionary (checkpoint_header.dict) supplies the keys; the
// custom mutator mutates the header text and, three times in four, rewrites the
// header_crc32 line to match, so the checks after the header CRC get inputs too.
// Expected: a CheckpointError with one line starting with the path. A header that
// parse_header accepts must describe this file: payload_bytes = size - 512,
// metadata_bytes <= payload_bytes, a supported format_version.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "fuzz_util.h"
#include "io/checkpoint_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    namespace ci = engine::checkpoint_internal;
    const ci::Header h = ci::parse_header(path, data, size);
    if (h.payload_bytes + fuzz::kUserBlock != size || h.metadata_bytes > h.payload_bytes ||
        h.format_version < 1 || h.format_version > engine::kCheckpointFormatVersion) {
      std::cerr << "parse_header accepted a header that does not describe the file: version "
                << h.format_version << ", payload " << h.payload_bytes << ", metadata "
                << h.metadata_bytes << ", file " << size << " bytes\n";
      std::abort();
    }
    // What the loader does next with the parsed fields: the payload checksums.
    ci::check_checksum(path, "the HDF5 metadata", fuzz::crc32_of(data + fuzz::kUserBlock, h.metadata_bytes), h.metadata_crc);
    ci::check_checksum(path, "the HDF5 payload", fuzz::crc32_of(data + fuzz::kUserBlock, h.payload_bytes), h.payload_crc);
  } catch (const engine::CheckpointError& e) {
    fuzz::require_one_line(e.what(), path);
  }
  try {
    engine::verify_checkpoint_file(path);
  } catch (const engine::CheckpointError& e) {
    fuzz::require_one_line(e.what(), path);
  }
  return 0;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::srand(seed);
  if (size < fuzz::kUserBlock || max_size < fuzz::kUserBlock || std::rand() % 4 == 0)
    return LLVMFuzzerMutate(data, size, max_size);
  // The text before the first NUL, without its header_crc32 line.
  std::string text(reinterpret_cast<const char*>(data), strnlen(reinterpret_cast<const char*>(data), fuzz::kUserBlock));
  const auto crc_line = text.rfind("header_crc32 ");
  if (crc_line != std::string::npos) text.resize(crc_line);
  std::vector<uint8_t> t(text.begin(), text.end());
  t.resize(fuzz::kUserBlock - 32);
  const size_t got = LLVMFuzzerMutate(t.data(), text.size(), t.size());
  text.assign(reinterpret_cast<const char*>(t.data()), got);
  char line[32];
  std::snprintf(line, sizeof line, "header_crc32 %08x\n",
                fuzz::crc32_of(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  text += line;
  if (text.size() > fuzz::kUserBlock) text.resize(fuzz::kUserBlock);
  std::memset(data, 0, fuzz::kUserBlock);
  std::memcpy(data, text.data(), text.size());
  return size;
}
