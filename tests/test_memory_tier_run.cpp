// The memory tier in a run (checkpoint.memory_tier; docs/recovery.md, "The memory
// tier"), through the CLI: a run killed with SIGKILL resumes from the step it had
// finished, ends with the bits of a run never interrupted, and removes its slot file; a
// damaged newest slot falls back to the other; --fresh removes the file; `engine resume
// FILE.h5` starts the tier over from the file.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "cli_util.h"
#include "engine/io/memory_tier.h"
#include "run_compare.h"
#include "run_dir_util.h"

using namespace test_util;
namespace fs = std::filesystem;

namespace {

// The slot file goes into a directory of the test's own (the tier works in any
// directory; /dev/shm is what a user names).
std::string keep_in(const std::string& dir) { return " --set checkpoint.memory_tier=\"" + dir + "\""; }

// Runs small_run(b) held after step `step` (tests/tools/engine_paused.cpp), then SIGKILLs it.
void kill_after_step(const std::string& b, const std::string& extra, int step) {
  Background run_bg = Background::command(paused_at(step, small_run(b) + extra));
  REQUIRE(run_bg.pid() > 0);
  REQUIRE(run_bg.wait_for("paused after step " + std::to_string(step)));
  ::kill(run_bg.pid(), SIGKILL);
  run_bg.finish();
}

}  // namespace

TEST_CASE("SIGKILL mid-epoch: the relaunch resumes from the memory tier at the step that ended, bit-exactly") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("memtier_kill"), shm = fresh_dir("memtier_kill_shm");
  // 16 steps an epoch, no mid-epoch saves: the disk holds epoch 1's end (step 16), the
  // memory tier step 21, the last one the killed process finished.
  kill_after_step(b, keep_in(shm), 21);
  const std::string file = engine::memory_tier::file_for(shm, b);
  REQUIRE(fs::exists(file));
  // `engine verify` and `engine inspect` read it as a resume would.
  const RunResult v = run("verify \"" + file + "\"");
  INFO(v.output);
  CHECK(v.exit_code == 0);
  CHECK(v.output.find(file + ": OK (slot ") != std::string::npos);
  CHECK(v.output.find(", global step 21") != std::string::npos);
  const RunResult i = run("inspect \"" + file + "\"");
  INFO(i.output);
  CHECK(i.exit_code == 0);
  CHECK(i.output.find("run directory: " + engine::memory_tier::canonical_run_dir(b)) != std::string::npos);
  CHECK(i.output.find("global step 21 (epoch 1 done, step 5 of the next)") != std::string::npos);
  CHECK(i.output.find("global step 20 (epoch 1 done, step 4 of the next)") != std::string::npos);
  const RunResult r = run(small_run(b) + keep_in(shm));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1, step 5 of epoch 2 (" + file + " slot ") != std::string::npos);
  CHECK(r.output.find("; the disk's newest is " + b + "/last.h5 (global step 16)") != std::string::npos);
  CHECK_FALSE(fs::exists(file));  // the run ended: nothing left in the tier
  expect_same_run(reference_run(), b);
}

TEST_CASE("a damaged newest slot is never trusted: the relaunch takes the other, one step further back") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("memtier_damaged"), shm = fresh_dir("memtier_damaged_shm");
  kill_after_step(b, keep_in(shm), 21);
  const std::string file = engine::memory_tier::file_for(shm, b);
  const engine::memory_tier::Contents c = engine::memory_tier::read(file, "", engine::memory_tier::Read::Seals);
  REQUIRE(c.newest());
  REQUIRE(c.newest()->global_step == 21);
  // One bit in the middle of the newest slot's payload (fc1's weights: the step digest's part).
  const off_t at = static_cast<off_t>(4096 + c.newest()->index * c.slot_bytes + 4096 + c.newest()->payload_bytes / 2);
  const int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char byte = 0;
  REQUIRE(::pread(fd, &byte, 1, at) == 1);
  byte ^= 1;
  REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
  ::close(fd);
  const RunResult v = run("verify \"" + file + "\"");
  INFO(v.output);
  CHECK(v.exit_code == 1);
  CHECK(v.output.find("is not sound: checksum mismatch") != std::string::npos);
  const RunResult r = run(small_run(b) + keep_in(shm));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1, step 4 of epoch 2 (" + file + " slot ") != std::string::npos);
  CHECK(r.output.find("skipped " + file + " slot " + std::to_string(c.newest()->index) + ": checksum mismatch") !=
        std::string::npos);
  expect_same_run(reference_run(), b);
}

TEST_CASE("--fresh removes the memory tier with the rest of the previous run") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("memtier_fresh"), shm = fresh_dir("memtier_fresh_shm");
  kill_after_step(b, keep_in(shm), 3);
  const std::string file = engine::memory_tier::file_for(shm, b);
  REQUIRE(fs::exists(file));
  const RunResult r = run(small_run(b) + keep_in(shm) + " --set train.epochs=1 --fresh");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("--fresh: removed the previous run's memory tier " + file) != std::string::npos);
  CHECK(r.output.find("resuming") == std::string::npos);
  CHECK_FALSE(fs::exists(file));
}

TEST_CASE("engine resume FILE.h5 starts the memory tier over from the file it restores") {
  if (!dataset_available()) return;
  const std::string b = fresh_dir("memtier_resume"), shm = fresh_dir("memtier_resume_shm");
  // The tier holds steps 20 and 21; the disk, epoch 1's end (step 16).
  kill_after_step(b, keep_in(shm), 21);
  const std::string file = engine::memory_tier::file_for(shm, b);
  REQUIRE(fs::exists(file));
  // Resumed from step 16 (the stored config keeps the tier) and killed after step 18: the
  // tier must hold step 18 of this resume, not step 21 of the history it replaced.
  Background resumed = Background::command(paused_at(18, "resume \"" + b + "/last.h5\""));
  REQUIRE(resumed.pid() > 0);
  REQUIRE(resumed.wait_for("paused after step 18"));
  ::kill(resumed.pid(), SIGKILL);
  const std::string out = resumed.finish().output;
  INFO(out);
  CHECK(out.find("removed " + file + ": the memory tier of the run directory's previous steps") != std::string::npos);
  const engine::memory_tier::Contents c = engine::memory_tier::read(file, "", engine::memory_tier::Read::Seals);
  REQUIRE(c.newest());
  CHECK(c.newest()->global_step == 18);
  const RunResult r = run(small_run(b) + keep_in(shm));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1, step 2 of epoch 2 (" + file + " slot ") != std::string::npos);
  expect_same_run(reference_run(), b);
}
