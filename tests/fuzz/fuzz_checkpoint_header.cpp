// libFuzzer harness: the checkpoint header (the 512-byte user block, format section 1.1).
// Inputs are small files, a header and at most a few hundred payload bytes, so every
// execution exercises the header checks in their documented order (magic, size, NUL
// padding, header CRC, format_version, keys, length, metadata and payload CRCs) through
// the public verify_checkpoint_file, and a dictionary (checkpoint_header.dict) supplies the
// keys. The custom mutator mutates the header text and, three times in four, rewrites
// the header_crc32 line to match, so the checks after the header CRC get inputs too.
// Expected: a CheckpointError with one line starting with the path; a crafted header
// that passes every check reaches HDF5 with a tiny payload and must be refused there.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    engine::verify_checkpoint_file(path);
  } catch (const engine::CheckpointError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) != 0 || what.find('\n') != std::string::npos) {
      std::cerr << "rejection is not one line starting with the path: [" << what << "]\n";
      std::abort();
    }
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
