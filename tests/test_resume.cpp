// The acceptance tests of the project: same seed => same bits, and a run stopped at
// any point (between epochs, mid-epoch, SIGKILL right after a save or between saves)
// and resumed ends bit-identical to an uninterrupted run. test_preemption.cpp does the
// same for the signals and limits of batch schedulers.
#include <doctest/doctest.h>
#include <signal.h>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "run_compare.h"

using namespace test_util;

TEST_CASE("two runs with the same seed give bit-identical checkpoints") {
  if (!dataset_available()) return;
  const std::string a = reference_run();
  const std::string b = fresh_dir("resume_same_seed");
  const RunResult r = run(small_run(b));
  REQUIRE(r.exit_code == 0);
  expect_same_run(a, b);
  // and a different seed really differs
  const std::string c = fresh_dir("resume_other_seed");
  REQUIRE(run(small_run(c) + " --set seed=1").exit_code == 0);
  CHECK(run("diff \"" + a + "/last.h5\" \"" + c + "/last.h5\"").exit_code == 1);
}

TEST_CASE("stop after 2 epochs, restart with the same command: identical to an uninterrupted run") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_epoch");
  RunResult r = run(small_run(b) + " --stop-after-epochs 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(column(b, "train_loss").size() == 2);
  r = run(small_run(b));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 2") != std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("engine resume CKPT continues the recorded run") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_cmd");
  REQUIRE(run(small_run(b) + " --stop-after-epochs 3").exit_code == 0);
  const RunResult r = run("resume \"" + b + "/last.h5\"");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 3") != std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("SIGKILL mid-epoch (between and right after mid-epoch saves) resumes bit-exactly") {
  if (!dataset_available()) return;
  // 16 steps per epoch; a mid-epoch last.h5 every 5 steps.
  for (int kill_step : {20, 23}) {
    CAPTURE(kill_step);
    const std::string b = fresh_dir("resume_kill_" + std::to_string(kill_step));
    const std::string extra = " --set checkpoint.every_n_steps=5";
    const std::string cmd = small_run(b) + extra;
    RunResult r = run_killed_after_step(kill_step, cmd);
    INFO(r.output);
    REQUIRE(r.signal == 9);
    const engine::Checkpoint ck = engine::load_checkpoint(b + "/last.h5");
    CHECK(ck.groups.at("trainer").get_int("global_step") == 20);
    CHECK(ck.groups.at("trainer").get_int("step_in_epoch") == 4);
    r = run(cmd);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("resuming from epoch 1, step 4") != std::string::npos);
    expect_same_run(reference_run(extra), b);
  }
}

TEST_CASE("SIGTERM (a scheduler's time limit) stops after a step, saves, and resumes bit-exactly") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_sigterm");
  // Held after step 20 (epoch 2, step 4) until the signal has reached it
  // (tests/tools/engine_paused.cpp), so it lands mid-epoch on any machine.
  Background run_bg = Background::command(paused_at(20, small_run(b)));
  REQUIRE(run_bg.wait_for("paused after step 20"));
  ::kill(run_bg.pid(), SIGTERM);
  const RunResult stopped = run_bg.finish();
  INFO(stopped.output);
  CHECK(stopped.exit_code == 130);
  CHECK(stopped.output.find("stopped at epoch 2 step 5; resume with the same command") != std::string::npos);
  CHECK(engine::load_checkpoint(b + "/last.h5").groups.at("trainer").get_int("global_step") == 21);
  const RunResult r = run(small_run(b));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1, step 5 of epoch 2") != std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("the number of CPU threads does not change a single bit") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("resume_threads");
  const RunResult r = run_with_env("OMP_NUM_THREADS=1", small_run(b));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  expect_same_run(reference_run(), b);
}

TEST_CASE("after a mid-epoch resume, epoch_seconds counts the whole epoch, the part before the resume included") {
  if (!dataset_available()) return;
  // 16 steps per epoch; killed after step 14 (saved there), resumed for the last 2 steps.
  const std::string extra = " --set checkpoint.every_n_steps=7";
  const std::string b = fresh_dir("resume_epoch_seconds");
  const std::string cmd = small_run(b) + extra;
  RunResult r = run_killed_after_step(14, cmd);
  INFO(r.output);
  REQUIRE(r.signal == 9);
  const engine::Checkpoint ck = engine::load_checkpoint(b + "/last.h5");
  REQUIRE(ck.groups.at("trainer").get_int("step_in_epoch") == 14);
  const double before_resume = ck.groups.at("trainer").get_real("epoch_elapsed_seconds");
  CHECK(before_resume > 0);
  r = run(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> seconds = column(b, "epoch_seconds");
  REQUIRE(seconds.size() == 4);
  CAPTURE(seconds[0]);
  CAPTURE(seconds[1]);
  // The 14 steps before the kill are in epoch 1's time: counting only the 2 after the
  // resume gave about an eighth of epoch 2, which the same process trained uninterrupted.
  CHECK(seconds[0] >= before_resume);
  CHECK(seconds[0] >= 0.5 * seconds[1]);
  // The state is still that of an uninterrupted run.
  expect_same_run(reference_run(extra), b);
}
