// Replicas (checkpoint.replicas, docs/recovery.md): a second tier of the run's checkpoints.
// Through the CLI on a small Fashion-MNIST run, each ending `engine diff`-identical to an
// uninterrupted run: the run directory lost after a power cut, resumed from the replica and
// repaired; a replica ahead of the run directory; a replica that cannot be written. Through
// the library on the synthetic data set: replica failures reported once per kind (the
// Env's faults), and a replica locked by another writer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_lock.h"
#include "engine/train/trainer.h"
#include "recovery_runs.h"
#include "run_compare.h"
#include "support/file_faults.h"
#include "synthetic_data.h"

using namespace test_util;
using namespace engine;
namespace fs = std::filesystem;

TEST_CASE("the run directory deleted mid-run: resumed from the replica, the run directory repaired, identical") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("recovery_primary_gone");
  const std::string replica = fresh_dir("recovery_primary_gone_replica") + "/tier2";
  const std::string cmd = small_run(dir) + replicas_flag(replica);
  // A power cut in epoch 3 (16 steps per epoch), then the node's disk is gone.
  const RunResult killed = run_killed_after_step(40, cmd);
  REQUIRE(killed.signal == SIGKILL);
  REQUIRE(global_step_of(replica + "/last.h5") == 32);
  fs::remove_all(dir);
  const RunResult r = run(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "resuming from epoch 2, step 0 of epoch 3 (" + replica + "/last.h5)"));
  CHECK(contains(r.output, "repaired " + dir + "/last.h5 (missing) from " + replica + "/last.h5"));
  CHECK(contains(r.output, "repaired " + dir + "/epoch_0002.h5 (missing)"));
  expect_same_run(reference_run(), dir);
  // Both tiers end with the same last state.
  CHECK(run("diff " + dir + "/last.h5 " + replica + "/last.h5").exit_code == 0);
}

TEST_CASE("a replica ahead of the run directory: resumed from the replica, the stale primary repaired") {
  if (!dataset_available()) return;
  const std::string replica = copy_of_three_epochs("recovery_ahead_replica");
  const std::string dir = fresh_dir("recovery_ahead");
  fs::copy_file(replica + "/epoch_0002.h5", dir + "/last.h5");  // the primary's saves stopped at epoch 2
  const RunResult r = run(small_run(dir) + replicas_flag(replica));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "resuming from epoch 3, step 0 of epoch 4 (" + replica + "/last.h5)"));
  CHECK(contains(r.output, "repaired " + dir + "/last.h5 (stale: global step 32, " + replica + "/last.h5 has 48)"));
  expect_same_run(reference_run(), dir);
}

TEST_CASE("a replica that cannot be written is reported once, and the run goes on to the same bits") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("recovery_replica_file");
  const std::string blocked = fresh_dir("recovery_replica_blocked") + "/not_a_dir";
  std::ofstream(blocked) << "a file where the replica directory should be";
  const RunResult r = run(small_run(dir) + replicas_flag(blocked));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::size_t warnings = 0;
  for (std::size_t at = r.output.find("warning: replica " + blocked); at != std::string::npos;
       at = r.output.find("warning: replica " + blocked, at + 1))
    ++warnings;
  CHECK(warnings == 1);
  expect_same_run(reference_run(), dir);
}

// ---- the library, on the synthetic data set -------------------------------------------

namespace {

struct Messages : TrainerObserver {
  std::vector<std::string> lines;
  void on_message(const std::string& m) override { lines.push_back(m); }
  std::size_t count(const std::string& needle) const {
    return static_cast<std::size_t>(
        std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return contains(l, needle); }));
  }
};

}  // namespace

TEST_CASE("replica failures: once per kind of failure, the run directory unaffected, training goes on") {
  const std::string dir = (fs::path(fresh_dir("recovery_lib_faults")) / "run").string();
  const std::string replica = (fs::path(fresh_dir("recovery_lib_faults_replica")) / "tier2").string();
  Config c = synthetic(dir, 4);
  c.checkpoint.replicas = {replica};
  c.checkpoint.every_n_steps = 2;
  // Saves written in turn (the replicas too), so that every save reaches the replica: with
  // checkpoint.async a save still waiting for the replica thread gives way to a newer one.
  c.checkpoint.async = false;
  file_faults::FaultyEnv env;
  Messages seen;
  {
    auto t = synthetic_trainer(c, &seen, &env);
    RunDirectory run(*t);
    // Read-only for the first two epochs' saves, then full: two warnings, not one per save.
    {
      file_faults::ScopedFault read_only(env, {file_faults::Step::Create, EROFS, 0, -1, "tier2/."});
      REQUIRE(run.fit({2}).ending == FitResult::Ending::Stopped);
      CHECK(read_only.injected() > 2);
    }
    CHECK(seen.count("warning: replica " + replica) == 1);
    CHECK(seen.count("Read-only file system") == 1);
    {
      file_faults::ScopedFault full(env, {file_faults::Step::Write, ENOSPC, 0, -1, "tier2/."});
      REQUIRE(run.fit({3}).ending == FitResult::Ending::Stopped);
      CHECK(full.injected() > 2);
    }
    CHECK(seen.count("warning: replica " + replica) == 2);
    CHECK(seen.count("No space left on device") == 1);
    CHECK(run.fit().ending == FitResult::Ending::Completed);  // and the replica is written again
  }
  CHECK(global_step_of(dir + "/last.h5") == 24);
  CHECK(global_step_of(replica + "/last.h5") == 24);
  CHECK(diff_checkpoints(dir + "/last.h5", replica + "/last.h5").identical);
  // Each replica directory has its own writer lock.
  {
    RunDirLock held = RunDirLock::acquire(replica);
    Messages again;
    Config more = c;
    more.train.epochs = 5;
    auto t = synthetic_trainer(more, &again);
    t->resume_from(dir + "/last.h5", LoadMode::Strict);
    RunDirectory run(*t);
    CHECK(run.fit().ending == FitResult::Ending::Completed);
    CHECK(again.count("warning: replica " + replica + " not written: " + replica + " is in use by another training run") == 1);
    CHECK(global_step_of(replica + "/last.h5") == 24);  // the lock's holder keeps it
  }
}
