// Test-only (built into engine_testing, never into libengine.a): checkpoint files that
// are deliberately wrong in one respect, so that the loader's refusals can be tested. A
// tampered file is a normal save edited afterwards with HDF5 and resealed: the library's
// writer knows nothing of tampering.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

namespace engine::checkpoint_testing {

struct RawDataset {
  std::string path;             // absolute HDF5 path, e.g. "/model/bad"
  std::string type;             // "float32", "float64", "int64", "int16", "uint8", "string"
  std::vector<uint64_t> dims;   // any rank; storage is never allocated, so size is free
  bool series_kind = false;     // add the attribute kind = "series"
  std::string external_file;    // non-empty: contiguous storage in this external file
  // How the data is stored (ignored with external_file). Unwritten: chunked (chunks of
  // one element), nothing allocated. The others write the values 0, 1, 2, ... (as the
  // dataset's type): FirstChunk writes only the first chunk of 1024 elements of a 1-D
  // dataset, the rest reads as fill values; Deflated is one gzip-compressed chunk;
  // Chunked is unfiltered chunks of half the first dimension, all written; Compact
  // keeps the data in the object header.
  enum class Layout { Unwritten, FirstChunk, Deflated, Chunked, Compact };
  Layout layout = Layout::Unwritten;
};
struct Tamper {
  int64_t format_version = kCheckpointFormatVersion;  // header and root attribute
  std::vector<std::string> omit_groups;
  std::vector<std::string> omit_root_attributes;
  std::vector<RawDataset> raw_datasets;
  bool plain_hdf5 = false;  // no engine header: an ordinary HDF5 file
};

// save_checkpoint, then the changes `tamper` asks for; Tamper{} is save_checkpoint.
void save_tampered(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper);

// Rewrites the user-block header of a file whose HDF5 payload was patched by hand, so
// that the payload passes the checksum and reaches the structural checks.
void reseal(const std::string& path, int64_t format_version = kCheckpointFormatVersion);

}  // namespace engine::checkpoint_testing
