// The HDF5 half of loading a checkpoint: opens a file image with libhdf5 and walks it
// into a manifest (io/checkpoint_manifest.h). Runs only inside the parser process of
// io/hdf5_sandbox_parser.cpp, never in the caller's process: libhdf5 1.10 cannot be trusted
// with hostile bytes (docs/security.md).
#pragma once
#include <cstddef>
#include <stdexcept>

#include "io/checkpoint_manifest.h"

namespace engine::hdf5_walk {

// The file is refused; the message does not name the file (the loader adds it).
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A dataset's bytes are needed (chunked or compact data read through HDF5) but the
// image holds only the metadata.
struct NeedsData {};

enum class ImageContent { MetadataOnly, Complete };

// `image` is the whole file (user block included), `size` bytes; with MetadataOnly the
// bytes past the metadata are zeros. HDF5 may write to the buffer (it never should).
manifest::Manifest walk(unsigned char* image, std::size_t size, ImageContent content);

}  // namespace engine::hdf5_walk
