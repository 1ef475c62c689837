// Private to the engine: one checkpoint written to several places (a run directory and
// its replicas, docs/recovery.md) from one image built once.
#pragma once
#include <exception>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

namespace engine {
namespace checkpoint_internal {

// save_checkpoint of `ckpt` to every path of `paths`, each atomically, all of them the
// same sealed bytes. A path's failure is its own: element i of the result is null, or
// what save_checkpoint would have thrown for paths[i] (a CheckpointWriteError when the
// disk refused), and the other paths are still written. A checkpoint that cannot be
// saved anywhere (an invalid group or key) throws before anything is written. With
// `sealed_image`, the file's bytes (sealed, as written) are also copied there, whether or
// not the writes succeeded: what a replica is written from later.
std::vector<std::exception_ptr> save_checkpoint_copies(const std::vector<std::string>& paths, const Checkpoint& ckpt,
                                                       Env* env = nullptr, std::string* sealed_image = nullptr);

}  // namespace checkpoint_internal
}  // namespace engine
