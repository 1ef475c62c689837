// Private to the engine: the safetensors format (https://github.com/huggingface/safetensors,
// "Format"), read and written by hand because Debian has no C++ library for it. The
// layout is small enough to state here:
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object (UTF-8): "name": {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]} per tensor, and optionally "__metadata__",
//             an object of string values; the writer pads it with spaces to a multiple of 8
//   the rest  the tensors' bytes, little-endian, row-major; offsets count from here
// The JSON itself goes through nlohmann_json. The reader trusts nothing: every claim of
// the header is checked against the bytes present before anything is allocated from it
// (the checkpoint loader's rules, docs/security.md): offsets inside the data, sizes
// equal to shape x dtype without overflow, no overlap, no hole, no key twice.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace engine {

// One line, starting with the file's path (or the origin given).
struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The dtypes the engine writes and reads: float32 tensors and the int64 counters
// PyTorch keeps as 0-d tensors (BatchNorm's num_batches_tracked).
enum class SafeDType { F32, I64 };
const char* to_string(SafeDType t);  // "F32", "I64"

struct SafeTensor {
  SafeDType dtype = SafeDType::F32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;  // little-endian, exactly numel x itemsize

  int64_t numel() const;
  std::vector<float> floats() const;  // F32 only
  int64_t scalar_i64() const;         // I64 with one element only
};

struct SafetensorsContent {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Bounds of a file the reader accepts (the format's own header limit is 100 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u << 20;
inline constexpr int kSafetensorsMaxRank = 8;

SafeTensor safe_tensor_f32(const std::vector<int64_t>& shape, const float* values);
SafeTensor safe_tensor_i64_scalar(int64_t value);

// The file's bytes. Throws SafetensorsError on a tensor whose bytes do not match its
// shape, or a name that is empty or "__metadata__".
std::string encode_safetensors(const SafetensorsContent& content);

// Decodes `n` bytes; `origin` starts every error message (the file's path).
SafetensorsContent decode_safetensors(const unsigned char* data, std::size_t n, const std::string& origin);

// Reads and decodes `path` (a regular file).
SafetensorsContent read_safetensors_file(const std::string& path);

}  // namespace engine
