// Test-only (built into engine_testing, never into libengine.a): writes checkpoint files
// that are deliberately wrong in one respect, so that the loader's refusals can be tested
// without the HDF5 headers.
#pragma once
#include <cstdint>
#include <string>

#include "engine/checkpoint.h"
#include "io/checkpoint_tamper.h"

namespace engine::checkpoint_testing {

using RawDataset = checkpoint_internal::RawDataset;
using Tamper = checkpoint_internal::Tamper;

void save_tampered(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper);

// Rewrites the user-block header of a file whose HDF5 payload was patched by hand, so
// that the payload passes the checksum and reaches the structural checks.
void reseal(const std::string& path, int64_t format_version = kCheckpointFormatVersion);

}  // namespace engine::checkpoint_testing
