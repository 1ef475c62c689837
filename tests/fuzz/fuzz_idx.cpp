// libFuzzer harness: the IDX reader (include/engine/io/idx.h), plain or gzip-compressed.
// The input is one file, read both as an image file and as a label file. Expected: a
// result consistent with its header, or a DataError whose message is one line starting
// with the path.
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "engine/io/idx.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    const engine::IdxImages images = engine::read_idx_images(path);
    if (images.count < 0 || images.rows < 1 || images.cols < 1 ||
        images.pixels.size() != static_cast<size_t>(images.count) * images.rows * images.cols) {
      std::cerr << "image file read with inconsistent sizes\n";
      std::abort();
    }
  } catch (const engine::DataError& e) {
    fuzz::require_one_line(e.what(), path + ": ");
  }
  try {
    const std::vector<uint8_t> labels = engine::read_idx_labels(path);
    for (uint8_t l : labels)
      if (l > 9) { std::cerr << "label out of range accepted\n"; std::abort(); }
  } catch (const engine::DataError& e) {
    fuzz::require_one_line(e.what(), path + ": ");
  }
  return 0;
}
