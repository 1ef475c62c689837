// Private to io/ and the tests (fuzzing harnesses included), never installed: the
// loader's entry point for bytes already in memory. No HDF5 header needed.
#pragma once
#include <cstddef>
#include <string>

#include "engine/io/checkpoint.h"

namespace engine {
namespace checkpoint_internal {

// load_checkpoint from bytes in memory: `name` stands for the file in every message.
// Checks exactly what load_checkpoint checks (header, length, checksums, structure);
// the bytes are copied, so the caller's buffer need not outlive the call.
Checkpoint load_checkpoint_from_bytes(const std::string& name, const unsigned char* data, std::size_t size);

}  // namespace checkpoint_internal
}  // namespace engine
