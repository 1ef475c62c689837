// fit() into the trainer's run directory (cfg.checkpoint.dir), as `engine train` runs it:
// for tests that train through fit() and look at the files.
#pragma once
#include "engine/run_directory.h"

namespace test_util {

inline engine::FitResult fit_in_run_dir(engine::Trainer& trainer, const engine::StopPlan& stop = {}) {
  engine::RunDirectory run(trainer);
  return run.fit(stop);
}

}  // namespace test_util
