// fit() into the trainer's run directory (cfg.checkpoint.dir), as `engine train` runs it:
// for tests that train through fit() and look at the files.
#pragma once
#include <unistd.h>

#include <string>

#include "engine/checkpoint.h"
#include "engine/run_directory.h"

namespace test_util {

inline engine::FitResult fit_in_run_dir(engine::Trainer& trainer, const engine::StopPlan& stop = {}) {
  engine::RunDirectory run(trainer);
  return run.fit(stop);
}

// With checkpoint.async a run prints an epoch's line while that epoch's checkpoints may
// still be on the writer thread: waits (up to 60 s) until `path` loads and holds at least
// `min_global_step` steps. True when it does.
inline bool wait_for_checkpoint(const std::string& path, int64_t min_global_step) {
  for (int i = 0; i < 600; ++i) {
    try {
      if (engine::load_checkpoint(path).groups.at("trainer").get_int("global_step") >= min_global_step) return true;
    } catch (const std::exception&) {
    }
    ::usleep(100000);
  }
  return false;
}

}  // namespace test_util
