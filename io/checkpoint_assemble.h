// Builds a Checkpoint from the parser's manifest (io/checkpoint_manifest.h) and the
// verified file buffer, trusting the manifest in nothing: every shape, offset and length
// is checked against the buffer before a byte is copied or a tensor made, and no more
// memory is allocated than the file holds (docs/security.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/io/checkpoint.h"
#include "io/checkpoint_manifest.h"

namespace engine {

// `file` is the whole verified file (`size` bytes, 64-byte aligned), kept alive by
// `owner`; tensors stored plainly in it come back as views of it. `header_version` is
// the format_version of the file's header, which the root attribute must equal. Keys
// come back as stored (wrapper prefixes not yet stripped), without upgrades applied.
Checkpoint assemble_checkpoint(const std::string& path, const manifest::Manifest& m, const std::shared_ptr<void>& owner,
                               unsigned char* file, std::size_t size, int64_t header_version);

}  // namespace engine
