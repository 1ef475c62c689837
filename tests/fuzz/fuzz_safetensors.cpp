// libFuzzer harness: the safetensors reader (io/safetensors.h) and, on what it accepts,
// the export check that reads such a file (engine::verify_export, engine/train/export.h).
// Expected: a decoded file consistent with its header (every tensor exactly numel x
// itemsize bytes, and the same content again after encoding it), or a rejection that is
// one line starting with the path, never a crash, a hang or an unbounded allocation.
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "engine/train/export.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  engine::SafetensorsContent content;
  try {
    content = engine::decode_safetensors(data, size, path);
  } catch (const engine::SafetensorsError& e) {
    fuzz::require_one_line(e.what(), path + ": ");
    return 0;
  }
  for (const auto& [name, t] : content.tensors) {
    const size_t item = t.dtype == engine::SafeDType::F32 ? 4 : 8;
    if (t.bytes.size() != static_cast<size_t>(t.numel()) * item) {
      std::cerr << "tensor " << name << " accepted with " << t.bytes.size() << " bytes for its shape\n";
      std::abort();
    }
  }
  const std::string again = engine::encode_safetensors(content);
  const engine::SafetensorsContent back =
      engine::decode_safetensors(reinterpret_cast<const unsigned char*>(again.data()), again.size(), "re-encoded");
  if (back.metadata != content.metadata || back.tensors.size() != content.tensors.size()) {
    std::cerr << "the re-encoded file decodes differently\n";
    std::abort();
  }
  try {
    engine::verify_export(path);
  } catch (const engine::ExportError& e) {
    fuzz::require_one_line(e.what(), path + ": ");
  }
  return 0;
}
