// Preemption as batch schedulers do it, through the CLI: SIGUSR1 writes last.h5 and the
// run goes on unchanged; --time-limit stops with a checkpoint before the limit and the
// run resumes bit-exactly; a second Ctrl-C exits at once with last.h5 sound. (SIGTERM
// and SIGKILL are in test_resume.cpp.)
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "run_compare.h"
#include "run_dir_util.h"

using namespace test_util;

// The run is held after a chosen step (tests/tools/engine_paused.cpp) until the signal
// has reached it, so the signal lands at that step on any machine, however fast or
// loaded: 16 steps per epoch, held after step 20 (epoch 2, step 4), the request acted on
// after the next step.
TEST_CASE("SIGUSR1 (a scheduler's warning) saves last.h5 mid-run and training goes on, bit-exactly") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_usr1");
  Background run_bg = Background::command(paused_at(20, small_run(b)));
  REQUIRE(run_bg.pid() > 0);
  REQUIRE(run_bg.wait_for("paused after step 20"));
  ::kill(run_bg.pid(), SIGUSR1);
  REQUIRE(run_bg.wait_for("checkpoint requested: last.h5 saved at epoch 2 step 5; training goes on"));
  // That last.h5 is a sound mid-epoch checkpoint of epoch 2 (unless epoch 2 has ended
  // since, and end_epoch replaced it).
  const engine::Checkpoint mid = engine::load_checkpoint(b + "/last.h5");
  CHECK(mid.groups.at("trainer").get_int("global_step") > 16);
  const RunResult r = run_bg.finish();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("test: loss") != std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("--time-limit stops with a checkpoint before the limit and resumes bit-exactly") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_time_limit");
  // Every step 0.1 s longer (engine_paused --slow-from-step): the 64 steps take more
  // than 6.4 s, so the run cannot end within the 4 s limit on any machine, and the
  // engine must stop itself before it, keeping its margin (2 %, at least 0.25 s, more
  // than the 0.1 s it cannot foresee).
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run_program("", paused_bin() + " --slow-from-step 1 --step-seconds 0.1 --", small_run(b) + " --time-limit 4");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  REQUIRE(r.exit_code == 75);
  CHECK(r.output.find("time limit: stopping at epoch") != std::string::npos);
  CHECK(seconds < 4.0 + 1.0);  // counted from the process' start; a margin is kept
  CHECK(run("verify \"" + b + "/last.h5\"").exit_code == 0);
  r = run(small_run(b));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch") != std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("a second Ctrl-C exits at once; last.h5 stays sound") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_double_interrupt");
  // Held after step 20 until two signals have reached it: the first asks for a stop, and
  // the second must end the process there and then, before any step or save (were it
  // ignored, the pause would let the run go on to stop and save at step 21).
  Background run_bg = Background::command(paused_at(20, small_run(b), "--release-after-signals 2"));
  REQUIRE(run_bg.pid() > 0);
  REQUIRE(run_bg.wait_for("paused after step 20"));
  // The epoch's line is printed while its last.h5 may still be on the writer thread
  // (checkpoint.async): wait until it is complete, as its observer would hear.
  REQUIRE(wait_for_checkpoint(b + "/last.h5", 16));
  ::kill(run_bg.pid(), SIGINT);
  // Two pending SIGINTs would merge into one: the second goes once the first is seen.
  REQUIRE(run_bg.wait_for("engine_paused: rank 0 saw signal 1"));
  ::kill(run_bg.pid(), SIGINT);
  const RunResult r = run_bg.finish();
  INFO(r.output);
  CHECK(r.exit_code == 130);
  CHECK(r.output.find("interrupted again, exiting now") != std::string::npos);
  CHECK(r.output.find("released after step") == std::string::npos);
  CHECK(r.output.find("stopped at epoch") == std::string::npos);
  const RunResult v = run("verify \"" + b + "/last.h5\"");
  INFO(v.output);
  CHECK(v.exit_code == 0);
  // and the run resumes from it: epoch 1's end, the last save before the stop
  CHECK(engine::load_checkpoint(b + "/last.h5").groups.at("trainer").get_int("global_step") == 16);
}
