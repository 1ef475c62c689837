// The files of a run directory (docs/cli.md, "The run directory"), named in one place,
// and the housekeeping around them that a host program does between runs: moving a
// previous run aside (`engine train --fresh`) and telling whether a run is complete.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/io/env.h"

namespace engine {

namespace run_files {
inline constexpr const char* kLast = "last.h5";             // every save of progress
inline constexpr const char* kBest = "best.h5";             // the best monitored epoch
inline constexpr const char* kMetrics = "metrics.jsonl";    // one line per epoch, then the test
inline constexpr const char* kTensorBoard = "tensorboard";  // the event files' folder
inline constexpr const char* kReport = "report.html";       // engine report
inline constexpr const char* kStepDigests = "step_digests.jsonl";  // every step's digests (docs/replay.md)
// The TensorBoard rewrite's temporary, inside kTensorBoard (one fixed name: one writer).
inline constexpr const char* kEventsRewrite = ".events-rewrite.tmp";

// "epoch_0005.h5": the milestone checkpoint after `epochs_done` epochs.
std::string milestone(int64_t epochs_done);
// "best_epoch_0005.h5": epoch 5 as one of the checkpoint.keep_best best epochs.
std::string best_of_epoch(int64_t epochs_done);
// Whether a file name in a run directory is one a run leaves there: the names above,
// milestones, and a writer's hidden temporaries (".last.h5.tmp.PID"); not ".lock".
bool is_run_file(const std::string& filename);
}  // namespace run_files

// Where --fresh put a previous run's files.
struct MovedAside {
  std::string dir;        // "" when there was nothing to move
  std::size_t files = 0;
};

// Moves the run files of `run_dir` (run_files::is_run_file) into a new sibling directory
// "<run_dir>.replaced-<UTC time>[-N]", so the run directory holds only the next run's
// files and nothing of the old run is destroyed. Throws std::runtime_error naming the
// path that could not be listed, created or moved. The caller holds the directory's lock.
// Through `env` (null: Env::posix()): the listing, the moves and the time in the name.
MovedAside move_previous_run_aside(const std::string& run_dir, Env* env = nullptr);

// Whether metrics.jsonl of `run_dir` ends with the test evaluation of a completed run.
bool test_result_recorded(const std::string& run_dir, Env* env = nullptr);

}  // namespace engine
