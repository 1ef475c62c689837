// Private to the engine: the check after a checkpoint save (checkpoint.verify). Shared by
// Trainer::save_checkpoint and the run directory's writer, so both verify the same way.
#pragma once
#include <string>

#include "engine/io/checkpoint.h"
#include "engine/nn/model.h"

namespace engine {

// Reloads `path` (header, length, checksums and structure, through the sandboxed parser
// like every load) and checks that it holds exactly `written`: the same groups, keys,
// shapes and dtypes, every tensor bit for bit and every scalar equal; then that the model
// group loads into a fresh instance of `prototype` and reads back the same bits. Throws a
// one-line CheckpointError starting with `path` and "verification failed" otherwise.
//
// A bit-identical model state stands in for the forward pass the check once ran on 64
// images: the forward is a deterministic function of that state (the rest is the model's
// code, which a reload does not change), so it caught nothing this does not, and this also
// covers the optimizer, counters, RNG and metrics, which the forward never looked at.
// `written` may hold tensors on any device. Safe to call on any thread. Reads through
// `env`, the Env the file was saved through.
void verify_saved_checkpoint(const std::string& path, const Checkpoint& written, const Model& prototype, Env& env);

}  // namespace engine
