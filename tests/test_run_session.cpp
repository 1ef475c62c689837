// engine::RunSession (engine/run/run_session.h) in one process: the job of one, the run
// directory's lock taken at construction, start/fit through the RunDirectory, the
// rank tag, abort_job. With several ranks: tests/embed (mpirun -np 2) and, through the
// CLI, tests/mpi/*.sh.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "engine/nn/models/registry.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_files.h"
#include "engine/run/run_lock.h"
#include "engine/run/run_session.h"
#include "scratch_dir.h"
#include "synthetic_data.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return scratch_root("run_session") / name; }

Config synthetic_config(const std::string& dir) {
  Config c = synthetic_mlp_config();
  c.train.epochs = 1;
  c.checkpoint.dir = dir;
  c.logging.tensorboard = false;
  return c;
}

std::unique_ptr<Model> synthetic_model(const Config& c) {
  return make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses);
}

// The launcher's variables, set for one scope (no session is built meanwhile: it would
// try to join an MPI job).
struct LaunchEnv {
  LaunchEnv(const char* rank, const char* size) {
    setenv("OMPI_COMM_WORLD_RANK", rank, 1);
    setenv("OMPI_COMM_WORLD_SIZE", size, 1);
  }
  ~LaunchEnv() {
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
  }
};

}  // namespace

// First: fork() before this process has started any thread.
TEST_CASE("abort_job in a job of one process exits with the code, stdout flushed") {
  const fs::path out = scratch("abort.out");
  fs::create_directories(out.parent_path());
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (!std::freopen(out.c_str(), "w", stdout)) _exit(99);
    std::fputs("written before the abort", stdout);  // no newline: only a flush writes it
    RunSession::abort_job(7);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  std::ifstream in(out);
  std::string text;
  std::getline(in, text);
  CHECK(text == "written before the abort");
}

TEST_CASE("rank_tag: from the launcher's environment, empty in one process") {
  CHECK(RunSession::rank_tag().empty());
  {
    LaunchEnv env("2", "4");
    CHECK(RunSession::rank_tag() == "rank 2: ");
  }
  {
    LaunchEnv env("0", "1");  // launched, but alone: nothing to tell apart
    CHECK(RunSession::rank_tag().empty());
  }
  CHECK(RunSession::rank_tag().empty());
}

TEST_CASE("a session of one process: the lock at once, the run directory's files, the lock let go") {
  const std::string dir = scratch("run").string();
  const Config cfg = synthetic_config(dir);
  {
    RunSession session(cfg);
    CHECK(session.rank() == 0);
    CHECK(session.size() == 1);
    CHECK(session.writes_run_dir());
    CHECK(session.collective().name() == "single");
    CHECK(session.device() == Device::cpu());
    CHECK(session.config().checkpoint.dir == dir);
    // Created and locked before any data is loaded: a second writer is refused now.
    CHECK(fs::is_directory(dir));
    CHECK_THROWS_AS(RunDirLock::acquire(dir), RunDirBusy);
    CHECK_THROWS_AS(RunSession{cfg}, RunDirBusy);
    CHECK(session.run_directory() == nullptr);
    CHECK_THROWS_AS(session.trainer(), std::logic_error);
    CHECK_THROWS_AS(session.fit(), std::logic_error);

    Trainer& t = session.start(synthetic_model(cfg), nullptr, std::make_unique<SyntheticDataset>());
    CHECK(&t == &session.trainer());
    REQUIRE(session.run_directory() != nullptr);
    CHECK(session.run_directory()->dir() == dir);
    CHECK_THROWS_AS(session.start(synthetic_model(cfg)), std::logic_error);
    const StartAgreement a = session.agree_on_start("");  // one rank: nothing hashed
    CHECK(a.data_bytes == 0);

    const FitResult r = session.fit();
    CHECK(r.ending == FitResult::Ending::Completed);
    CHECK(t.epochs_done() == 1);
    CHECK(r.test.has_value());
    CHECK(fs::exists(fs::path(dir) / run_files::kLast));
    CHECK(fs::exists(fs::path(dir) / run_files::kMetrics));
    CHECK_THROWS_AS(RunDirLock::acquire(dir), RunDirBusy);  // the RunDirectory holds it now
  }
  CHECK_NOTHROW(RunDirLock::acquire(dir));  // the session let it go
}

TEST_CASE("a run directory that cannot be created is one line naming it") {
  const fs::path file = scratch("a_file");
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "x";
  const std::string dir = (file / "run").string();
  try {
    RunSession session(synthetic_config(dir));
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.rfind(dir + ": cannot create the run directory: ", 0) == 0);
    CHECK(what.find('\n') == std::string::npos);
  }
}
