// Private to io/ and the test library (tests/support/checkpoint_testing.h), never
// installed: the writer's seam for files that are deliberately wrong in one respect, so
// that the loader's refusals can be tested. No HDF5 header needed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint.h"

namespace engine {
namespace checkpoint_internal {

// Deliberately wrong files, so that the loader's refusals can be tested; only the test
// library (tests/support/checkpoint_testing.h) reaches these.
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
// save_checkpoint with a Tamper; Tamper{} is save_checkpoint.
void save_tampered_impl(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper);

}  // namespace checkpoint_internal
}  // namespace engine
