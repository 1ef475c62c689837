// The acceptance tests of the project: same seed => same bits, and a run stopped at
// any point (between epochs, mid-epoch, SIGKILL right after a save or between saves,
// SIGTERM, a time limit) and resumed ends bit-identical to an uninterrupted run; a
// SIGUSR1 checkpoint leaves the run's bits unchanged.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "engine/checkpoint.h"

using namespace test_util;

namespace {

std::vector<double> column(const std::string& run_dir, const char* key) {
  std::vector<double> v;
  for (const std::string& l : read_lines(run_dir + "/metrics.jsonl")) {
    auto j = nlohmann::json::parse(l);
    if (j.contains(key)) v.push_back(j[key].get<double>());
  }
  return v;
}

void expect_same_run(const std::string& a, const std::string& b) {
  const RunResult d = run("diff \"" + a + "/last.h5\" \"" + b + "/last.h5\"");
  INFO(d.output);
  CHECK(d.exit_code == 0);
  for (const char* key : {"train_loss", "val_loss", "val_acc", "lr", "test_acc"}) {
    CAPTURE(key);
    const auto ca = column(a, key), cb = column(b, key);
    CHECK(!ca.empty());
    CHECK(ca == cb);  // exact: the same bits
  }
}

// An uninterrupted run with the same flags (the stored config must match too).
std::string reference_run(const std::string& extra = "") {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(extra);
  if (it != dirs.end()) return it->second;
  const std::string dir = fresh_dir("resume_reference_" + std::to_string(dirs.size()));
  const RunResult r = run(small_run(dir) + extra);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  dirs[extra] = dir;
  return dir;
}

}  // namespace

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
    RunResult r = run(cmd + " --kill-after-steps " + std::to_string(kill_step));
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
  // timeout(1) sends SIGTERM after 2 s, wherever the run is: mid-epoch, in validation...
  const std::string cmd = "timeout -s TERM 2 " + engine_bin() + " " + small_run(b) + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  INFO(out);
  // 124: stopped by the signal (the engine exits 130 after saving); 0: finished first.
  REQUIRE(WIFEXITED(status));
  CHECK((WEXITSTATUS(status) == 124 || WEXITSTATUS(status) == 0));
  const RunResult r = run(small_run(b));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
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
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(run_bg.pid(), SIGINT);
  ::usleep(100000);  // two pending SIGINTs would merge into one
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
