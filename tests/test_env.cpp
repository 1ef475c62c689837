// The run's I/O goes through the Env it is given (engine/io/env.h): reads, removals,
// listings, directories and the lock fail as the Env says, with the library's own
// messages (tests/support/file_faults.h), and the run's timestamps and time limit take
// the Env's clocks (tests/support/fake_clock.h). test_save_faults covers the six steps of
// a file replacement.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/error_text.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/env.h"
#include "engine/nn/models/registry.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_files.h"
#include "engine/run/run_lock.h"
#include "engine/run/run_session.h"
#include "engine/train/trainer.h"
#include "io/deferred_remove.h"
#include "scratch_dir.h"
#include "support/fake_clock.h"
#include "support/file_faults.h"
#include "synthetic_data.h"

using namespace engine;
using namespace test_util;
using file_faults::FaultyEnv;
using file_faults::ScopedFault;
using file_faults::Step;
using fake_clock::FakeClockEnv;
namespace fs = std::filesystem;

namespace {

// A new, empty directory for one test case.
std::string fresh(const std::string& name) {
  const fs::path p = scratch_root("env") / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

Config synthetic_config(const std::string& dir, int64_t epochs = 1) {
  Config c = synthetic_mlp_config();
  c.train.epochs = epochs;
  c.checkpoint.dir = dir;
  c.logging.tensorboard = false;
  return c;
}

// A trainer on the synthetic data whose files and clocks are `env`'s.
std::unique_ptr<Trainer> trainer_with(const Config& c, Env& env) {
  TrainerOptions options;
  options.data = std::make_unique<SyntheticDataset>();
  options.env = &env;
  return std::make_unique<Trainer>(c, Device::cpu(),
                                   make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses),
                                   std::move(options));
}

using test_support::error_of;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// 2001-02-03 04:05:06 UTC.
const std::chrono::system_clock::time_point kFakeWall = std::chrono::system_clock::from_time_t(981173106);

}  // namespace

TEST_CASE("a checkpoint read the Env refuses is the loader's one-line error, through load and resume_from") {
  const std::string dir = fresh("read");
  const std::string path = dir + "/state.h5";
  const Config cfg = synthetic_config(dir);
  trainer_with(cfg, Env::posix())->save_checkpoint(path);
  FaultyEnv env;
  const struct {
    Step step;
    int error;
    std::string message;
  } cases[] = {
      {Step::OpenForReading, EACCES, path + ": cannot open: Permission denied"},
      {Step::Fstat, EIO, path + ": cannot stat: Input/output error"},
      {Step::Read, EIO, path + ": cannot read: Input/output error"},
  };
  for (const auto& c : cases) {
    CAPTURE(file_faults::step_name(c.step));
    ScopedFault fault(env, {c.step, c.error});
    CHECK(error_of([&] { load_checkpoint(path, &env); }) == c.message);
    CHECK(fault.injected() == 1);
  }
  {
    const std::unique_ptr<Trainer> t = trainer_with(cfg, env);
    ScopedFault fault(env, {Step::Read, EIO, 0, -1});
    CHECK(error_of([&] { t->resume_from(path, LoadMode::Strict); }) == path + ": cannot read: Input/output error");
    CHECK(error_of([&] { verify_checkpoint_file(path, &env); }) == path + ": cannot read: Input/output error");
  }
  CHECK(load_checkpoint(path, &env).groups.count("model") == 1);  // the fault gone, it loads
}

TEST_CASE("the run directory's lock is taken through the Env, and its refusals keep their words") {
  const std::string dir = fresh("lock");
  const std::string lock = RunDirLock::lock_path(dir);
  FaultyEnv env;
  {
    ScopedFault fault(env, {Step::OpenLockFile, EACCES});
    CHECK(error_of([&] { RunDirLock::acquire(dir, &env); }) ==
          lock + ": cannot open the run directory's lock file: Permission denied");
  }
  {
    ScopedFault fault(env, {Step::Lock, ENOLCK});
    CHECK(error_of([&] { RunDirLock::acquire(dir, &env); }) == lock + ": cannot lock the run directory: No locks available");
  }
  {
    ScopedFault fault(env, {Step::Truncate, EIO});
    CHECK(error_of([&] { RunDirLock::acquire(dir, &env); }) ==
          lock + ": cannot write the run directory's lock file: Input/output error");
  }
  {
    // EWOULDBLOCK is another holder: busy, naming whoever the file names (nobody yet).
    ScopedFault fault(env, {Step::Lock, EWOULDBLOCK});
    bool busy = false;
    try {
      RunDirLock::acquire(dir, &env);
    } catch (const RunDirBusy& e) {
      busy = std::string(e.what()).rfind(dir + " is in use by another training run: another process", 0) == 0;
    }
    CHECK(busy);
  }
  {
    // A session takes its lock through RunSessionOptions::env.
    RunSessionOptions options;
    options.env = &env;
    ScopedFault fault(env, {Step::Lock, ENOLCK});
    CHECK(error_of([&] { RunSession session(synthetic_config(dir), options); }) ==
          lock + ": cannot lock the run directory: No locks available");
    CHECK(fault.injected() == 1);
  }
  // Its text's time is the Env's wall clock.
  FakeClockEnv clock;
  clock.set_wall(kFakeWall);
  {
    const RunDirLock held = RunDirLock::acquire(dir, &clock);
    CHECK(read_text(lock).find(" since 2001-02-03 04:05:06 UTC\n") != std::string::npos);
  }
  CHECK(read_text(lock).empty());  // released through the same Env
}

TEST_CASE("the run directory is created through the Env") {
  const std::string dir = fresh("make_dirs") + "/run";
  FaultyEnv env;
  ScopedFault fault(env, {Step::MakeDirs, EROFS, 0, -1});
  RunSessionOptions options;
  options.env = &env;
  CHECK(error_of([&] { RunSession session(synthetic_config(dir), options); }) ==
        dir + ": cannot create the run directory: Read-only file system");
  const std::unique_ptr<Trainer> t = trainer_with(synthetic_config(dir), env);
  CHECK(error_of([&] { RunDirectory run(*t); }) ==
        "filesystem error: cannot create directories: Read-only file system [" + dir + "]");
  CHECK(fault.injected() == 2);
  CHECK(!fs::exists(dir));
}

TEST_CASE("milestone rotation lists and removes through the Env; a refusal stops the run with the filesystem's words") {
  Config cfg = synthetic_config("", 3);
  cfg.checkpoint.every_n_epochs = 1;
  cfg.checkpoint.keep_last = 1;
  cfg.checkpoint.async = false;
  SUBCASE("a milestone that cannot be removed") {
    cfg.checkpoint.dir = fresh("rotation_remove");
    const std::string first = cfg.checkpoint.dir + "/epoch_0001.h5";
    FaultyEnv env;
    const std::unique_ptr<Trainer> t = trainer_with(cfg, env);
    ScopedFault fault(env, {Step::Remove, EIO, 0, -1, first});
    RunDirectory run(*t);
    CHECK(error_of([&] { run.fit(); }) == "filesystem error: cannot remove: Input/output error [" + first + "]");
    CHECK(fault.injected() == 1);
    CHECK(t->epochs_done() == 2);  // epoch 2's milestone made epoch 1's one too many
    CHECK(fs::exists(first));
  }
  SUBCASE("a run directory that cannot be listed") {
    cfg.checkpoint.dir = fresh("rotation_list");
    FaultyEnv env;
    const std::unique_ptr<Trainer> t = trainer_with(cfg, env);
    RunDirectory run(*t);
    ScopedFault fault(env, {Step::ListDir, EIO, 0, -1, cfg.checkpoint.dir});
    CHECK(error_of([&] { run.fit(); }) ==
          "filesystem error: directory iterator cannot open directory: Input/output error [" + cfg.checkpoint.dir + "]");
    CHECK(fault.injected() >= 1);
    CHECK(t->epochs_done() == 1);
  }
}

TEST_CASE("the removal a save leaves to the background goes through the save's Env") {
  const std::string dir = fresh("deferred_remove");
  const std::string path = dir + "/last.h5";
  const Config cfg = synthetic_config(dir);
  const std::unique_ptr<Trainer> t = trainer_with(cfg, Env::posix());
  const Checkpoint state = t->snapshot();
  save_checkpoint(path, state);
  FaultyEnv env;
  {
    // Replacing last.h5 keeps the old version under a hidden name until the new one is
    // in place; its removal is refused.
    ScopedFault fault(env, {Step::Remove, EIO, 0, -1, "/.last.h5.old."});
    save_checkpoint(path, state, &env);  // returns once the refused removal was tried
    CHECK(fault.injected() == 1);
  }
  finish_pending_removals();
  const std::vector<std::string> names = names_in(dir);
  REQUIRE(names.size() == 2);
  CHECK(names[0].rfind(".last.h5.old." + std::to_string(getpid()) + ".", 0) == 0);
  CHECK(names[1] == "last.h5");
}

TEST_CASE("metrics.jsonl and the TensorBoard events are written through the run's Env") {
  Config cfg = synthetic_config(fresh("events"), 2);
  cfg.logging.tensorboard = true;
  cfg.checkpoint.async = false;
  FaultyEnv env;
  const std::unique_ptr<Trainer> t = trainer_with(cfg, env);
  RunDirectory run(*t);
  ScopedFault fault(env, {Step::Write, ENOSPC, 0, -1, "/tensorboard/"});
  bool write_error = false;
  std::string message;
  try {
    run.fit();
  } catch (const CheckpointWriteError& e) {
    write_error = true;
    message = e.what();
  }
  CHECK(write_error);
  CHECK(message == cfg.checkpoint.dir + "/tensorboard/" + run_files::kEventsRewrite +
                       ": cannot write TensorBoard events (No space left on device)");
  CHECK(t->epochs_done() == 1);
  // metrics.jsonl, written just before, went through: the fault named only the events.
  CHECK(test_util::read_lines(cfg.checkpoint.dir + "/metrics.jsonl").size() == 1);
}

TEST_CASE("--fresh's move aside lists, stamps and moves through the Env; the recorded test result is read through it") {
  const std::string dir = fresh("fresh");
  std::ofstream(dir + "/metrics.jsonl") << "{\"test_acc\":0.5,\"test_loss\":1.0,\"test_count\":10}\n";
  FakeClockEnv clock;
  clock.set_wall(kFakeWall);
  FaultyEnv env(clock);
  {
    ScopedFault fault(env, {Step::OpenForReading, EIO});
    CHECK(!test_result_recorded(dir, &env));
  }
  CHECK(test_result_recorded(dir, &env));
  {
    ScopedFault fault(env, {Step::ListDir, EIO});
    CHECK(error_of([&] { move_previous_run_aside(dir, &env); }) == dir + ": cannot list the run directory: Input/output error");
  }
  const std::string aside = dir + ".replaced-20010203T040506Z";
  {
    ScopedFault fault(env, {Step::MakeDirs, ENOSPC});
    CHECK(error_of([&] { move_previous_run_aside(dir, &env); }) ==
          aside + ": cannot create a directory for the previous run's files: No space left on device");
  }
  {
    ScopedFault fault(env, {Step::Rename, EXDEV});
    CHECK(error_of([&] { move_previous_run_aside(dir, &env); }) ==
          dir + "/metrics.jsonl: cannot move it aside to " + aside +
              ": Invalid cross-device link (move or remove the previous run's files yourself)");
  }
  const MovedAside moved = move_previous_run_aside(dir, &env);
  CHECK(moved.dir == aside + "-2");  // the failed try above made `aside`, empty
  CHECK(moved.files == 1);
  CHECK(fs::exists(moved.dir + "/metrics.jsonl"));
}

TEST_CASE("the run's timestamps are the Env's wall clock and its timings the Env's monotonic clock") {
  Config cfg = synthetic_config(fresh("clock"), 2);
  cfg.logging.tensorboard = true;
  FakeClockEnv clock;
  clock.set_wall(kFakeWall);
  clock.set_monotonic_step(std::chrono::milliseconds(250));
  const std::unique_ptr<Trainer> t = trainer_with(cfg, clock);
  {
    RunDirectory run(*t);
    CHECK(read_text(run.path(".lock")).find(" since 2001-02-03 04:05:06 UTC\n") != std::string::npos);
    REQUIRE(run.fit().ending == FitResult::Ending::Completed);
    for (const SaveRecord& s : run.saves()) {
      CHECK(s.stall_seconds >= 0.25);
      CHECK(s.total_seconds >= 0.25);
    }
  }
  const std::string& dir = cfg.checkpoint.dir;
  CHECK(load_checkpoint(dir + "/last.h5").meta.created_utc == "2001-02-03T04:05:06Z");
  CHECK(load_checkpoint(dir + "/best.h5").meta.created_utc == "2001-02-03T04:05:06Z");
  const std::vector<std::string> events = names_in(dir + "/tensorboard");
  REQUIRE(events.size() == 1);
  CHECK(events[0].rfind("events.out.tfevents.981173106.", 0) == 0);
  // epoch_seconds: whole readings of the fake clock, a quarter second each.
  const std::vector<std::string> lines = test_util::read_lines(dir + "/metrics.jsonl");
  REQUIRE(lines.size() == 3);
  for (int i = 0; i < 2; ++i) {
    const double seconds = nlohmann::json::parse(lines[i]).at("epoch_seconds").get<double>();
    CAPTURE(seconds);
    CHECK(seconds >= 0.25);
    CHECK(std::abs(seconds * 4 - std::round(seconds * 4)) < 1e-9);
  }
}

TEST_CASE("the time limit runs on the Env's monotonic clock") {
  // Ten seconds pass at every reading: the 600 s limit is reached within a few steps,
  // where the machine's clock would let these 50 tiny epochs complete.
  const Config cfg = synthetic_config(fresh("time_limit"), 50);
  FakeClockEnv clock;
  clock.set_monotonic_step(std::chrono::seconds(10));
  const std::unique_ptr<Trainer> t = trainer_with(cfg, clock);
  RunDirectory run(*t);
  StopPlan stop;
  stop.time_limit_seconds = 600;
  const FitResult r = run.fit(stop);
  CHECK(r.ending == FitResult::Ending::Stopped);
  CHECK(r.stop_cause == FitResult::StopCause::TimeLimit);
  CHECK(t->epochs_done() < 50);
  CHECK(fs::exists(cfg.checkpoint.dir + "/last.h5"));
}
