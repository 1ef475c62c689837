// What the sandboxed HDF5 parser (io/hdf5_sandbox.h) reports about a checkpoint: every
// root attribute, group key, scalar and dataset, with where each dataset's bytes are.
// The loader builds the Checkpoint from this alone and never lets libhdf5 parse the
// file in its own process. The parser's process may have been subverted by the file, so
// decode() trusts nothing: every length is checked against the message, and the loader
// checks every offset, length and shape against the file buffer (docs/security.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace engine::manifest {

enum class EntryKind : uint8_t { Int = 1, Real, String, Tensor, Series };

// Element types of datasets as stored. Series are F64; tensors the other four.
enum class ElemType : uint8_t { F32 = 1, F16, I32, U8, F64 };
std::size_t elem_size(ElemType t);

enum class ByteOrder : uint8_t { Little = 1, Big };

// Where a dataset's bytes are: nowhere (no elements), a contiguous range of the file
// (as stored, in the dataset's byte order), or copied into the manifest (compact or
// chunked data, already converted to little-endian by the parser).
enum class Storage : uint8_t { None = 1, InFile, Inline };

struct Entry {
  std::string key;    // key within its group: "conv1.weight", "step/conv1.weight"
  std::string where;  // HDF5 path for messages: "/optimizer/step@conv1.weight"
  EntryKind kind = EntryKind::Int;
  int64_t int_value = 0;
  double real_value = 0;
  std::string text;
  // Datasets only.
  ElemType elem = ElemType::F32;
  ByteOrder order = ByteOrder::Little;
  std::vector<uint64_t> dims;  // empty: scalar dataspace
  Storage storage = Storage::None;
  uint64_t offset = 0, bytes = 0;  // InFile: absolute file offset and length
  std::string inline_bytes;        // Inline
};

struct Group {
  std::string name;
  std::vector<Entry> entries;
};

struct Manifest {
  std::vector<Entry> root_attributes;  // scalars; key = attribute name
  std::vector<Group> groups;           // in the file's link order
};

std::string encode(const Manifest& m);
// False, with `why`, on any malformed or oversized input.
bool decode(const unsigned char* data, std::size_t size, Manifest& out, std::string& why);

}  // namespace engine::manifest
