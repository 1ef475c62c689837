// run_files (engine/run/run_files.h): the names a run leaves in its directory, --fresh
// moving them aside, and whether a run's metrics hold its test result.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "cli_util.h"
#include "engine/run/run_files.h"

using namespace test_util;

TEST_CASE("run_files: the names a run leaves, --fresh moving them aside, a completed run's metrics") {
  using namespace engine;
  CHECK(run_files::milestone(5) == "epoch_0005.h5");
  CHECK(run_files::milestone(12345) == "epoch_12345.h5");
  for (const char* n : {"last.h5", "best.h5", "metrics.jsonl", "tensorboard", "report.html", "epoch_0003.h5",
                        ".last.h5.tmp.1234", ".metrics.jsonl.tmp.77"})
    CHECK_MESSAGE(run_files::is_run_file(n), n);
  for (const char* n : {".lock", "notes.txt", "last.h5.bak", "epoch_3.txt", "."})
    CHECK_MESSAGE(!run_files::is_run_file(n), n);

  const std::string dir = fresh_dir("run_files_fresh");
  namespace fs = std::filesystem;
  for (const fs::path& p : fs::directory_iterator(fs::path(dir).parent_path()))
    if (p.filename().string().rfind(fs::path(dir).filename().string() + ".replaced-", 0) == 0) fs::remove_all(p);
  CHECK(move_previous_run_aside(dir).files == 0);  // nothing to move: nothing created
  for (const char* n : {"last.h5", "epoch_0001.h5", "metrics.jsonl", "notes.txt", ".lock"})
    std::ofstream(dir + "/" + n) << "x";
  CHECK_FALSE(test_result_recorded(dir));
  std::ofstream(dir + "/metrics.jsonl") << "{\"epoch\":1}\n{\"test_acc\":0.5,\"test_loss\":1.0}\n";
  CHECK(test_result_recorded(dir));
  const MovedAside moved = move_previous_run_aside(dir);
  CHECK(moved.files == 3);
  CHECK(fs::exists(moved.dir + "/last.h5"));
  CHECK(fs::exists(moved.dir + "/epoch_0001.h5"));
  CHECK(fs::exists(moved.dir + "/metrics.jsonl"));
  CHECK(fs::exists(dir + "/notes.txt"));  // not a run's file: stays
  CHECK(fs::exists(dir + "/.lock"));
  CHECK_FALSE(fs::exists(dir + "/last.h5"));
  CHECK_FALSE(test_result_recorded(dir));
  // A second move in the same second gets its own directory.
  std::ofstream(dir + "/best.h5") << "x";
  const MovedAside again = move_previous_run_aside(dir);
  CHECK(again.files == 1);
  CHECK(again.dir != moved.dir);
  CHECK_THROWS_AS(move_previous_run_aside(dir + "/missing"), std::runtime_error);
  fs::remove_all(moved.dir);
  fs::remove_all(again.dir);
}
