// Private to the export (engine/train/export*.cpp): a state as a safetensors file's
// content, with PyTorch's names, and back.
#pragma once
#include <string>

#include "engine/core/state.h"
#include "io/safetensors.h"

namespace engine {
namespace export_internal {

// Float32 tensors, and the int64 counters as 0-d int64 tensors; throws ExportError for
// another kind of entry.
SafetensorsContent to_safetensors(const StateDict& state);
// The file's tensors as a state; throws ExportError, naming `origin`, for an int64
// tensor that is not 0-d.
StateDict state_from_safetensors(const SafetensorsContent& c, const std::string& origin);

}  // namespace export_internal
}  // namespace engine
