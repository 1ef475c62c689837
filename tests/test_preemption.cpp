// Preemption as batch schedulers do it, through the CLI: SIGUSR1 writes last.h5 and the
// run goes on unchanged; --time-limit stops with a checkpoint before the limit and the
// run resumes bit-exactly; a second Ctrl-C exits at once with last.h5 sound. (SIGTERM
// and SIGKILL are in test_resume.cpp.)
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "cli_util.h"
#include "engine/checkpoint.h"
#include "run_compare.h"
#include "run_dir_util.h"

using namespace test_util;

TEST_CASE("SIGUSR1 (a scheduler's warning) saves last.h5 mid-run and training goes on, bit-exactly") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_usr1");
  Background run_bg(small_run(b));
  REQUIRE(run_bg.pid() > 0);
  REQUIRE(run_bg.wait_for("epoch 1/4"));  // now in epoch 2, 16 steps per epoch
  ::kill(run_bg.pid(), SIGUSR1);
  REQUIRE(run_bg.wait_for("checkpoint requested: last.h5 saved at epoch 2 step"));
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
  // About a quarter of the run's time (it takes 5-60 s, shared machines included).
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run(small_run(b) + " --time-limit 4");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  if (r.exit_code == 0) {  // a machine fast enough to finish in 4 s: nothing to test
    MESSAGE("the run finished within the time limit");
    return;
  }
  CHECK(r.exit_code == 75);
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
  Background run_bg(small_run(b));
  REQUIRE(run_bg.pid() > 0);
  REQUIRE(run_bg.wait_for("epoch 1/4"));
  // The epoch's line is printed while its last.h5 may still be on the writer thread
  // (checkpoint.async): wait until it is complete, as its observer would hear.
  REQUIRE(wait_for_checkpoint(b + "/last.h5", 16));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(run_bg.pid(), SIGINT);
  // Two pending SIGINTs would merge into one; 20 ms lets the first be handled, and is
  // well within the step and the save a stop takes.
  ::usleep(20000);
  ::kill(run_bg.pid(), SIGINT);
  const RunResult r = run_bg.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code == 130);
  CHECK(seconds < 1.1);
  CHECK(r.output.find("interrupted again, exiting now") != std::string::npos);
  const RunResult v = run("verify \"" + b + "/last.h5\"");
  INFO(v.output);
  CHECK(v.exit_code == 0);
  // and the run resumes from it
  CHECK(engine::load_checkpoint(b + "/last.h5").groups.at("trainer").get_int("global_step") >= 16);
}
