// RunDirectory (engine/run/run_directory.h): fit() without one writes no file, and its
// estimate of a save's time, before the first save and from the saves measured.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "engine/run/run_directory.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "tiny_run.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;

TEST_CASE("fit() without a run directory writes no file; a RunDirectory estimates its first save from the state's size") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_no_sink") + "/run";
  const Config cfg = tiny_config(dir);
  Trainer t(cfg, Device::cpu(), make_model(cfg));
  StopPlan one_epoch;
  one_epoch.after_epochs = 1;
  CHECK(t.fit(one_epoch).stop_cause == FitResult::StopCause::EpochLimit);
  CHECK(t.epochs_done() == 1);
  CHECK_FALSE(fs::exists(dir));  // no lock, no checkpoint, no metrics.jsonl: a rank other than 0
  // --time-limit before anything was saved: the CNN's ~5 MB state is estimated at a
  // fraction of a second (it once assumed 1 s per save, which stopped short runs early).
  RunDirectory run(t);
  const double first = run.save_estimate(t);
  CHECK(first > 0.1);
  CHECK(first < 0.5);
  run.save(t, CheckpointKind::Last);
  run.flush(t);
  REQUIRE(run.saves().size() == 1);
  CHECK(run.saves()[0].total_seconds > 0);
  CHECK(run.save_estimate(t) >= 1.25 * run.saves()[0].total_seconds * 0.5);  // now from the saves measured
  CHECK(fs::exists(dir + "/last.h5"));
}
