// The run directory's lock (engine/run/run_lock.h): one writer per run directory, across
// processes and within one; a second writer is refused at once, naming the holder, and a
// holder that died never blocks.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "cli_util.h"
#include "engine/run/run_lock.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

TEST_CASE("run directory lock: a second writer is refused at once, naming the holder; a dead holder never blocks") {
  const std::string dir = fresh_dir("run_lock");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  // The holder is killed when this test case ends, however it ends (ChildProcess).
  test_util::ChildProcess holder = test_util::ChildProcess::fork_running([&] {
    ::close(ready[0]);
    try {
      RunDirLock held = RunDirLock::acquire(dir);
      (void)!::write(ready[1], "1", 1);
      for (;;) ::pause();  // until SIGKILL
    } catch (...) {
      ::_exit(3);
    }
  });
  const pid_t child = holder.pid();
  REQUIRE(child > 0);
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);

  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const auto t0 = Clock::now();
  std::string message;
  try {
    RunDirLock second = RunDirLock::acquire(dir);
    FAIL("a second writer got the lock");
  } catch (const RunDirBusy& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(message);
  // At once: the holder never lets go, so a writer that waited for it would hang here
  // until the test's time limit. The bound only tells the two apart (no speed asked).
  CHECK(seconds < 60.0);
  CHECK(message.find("pid " + std::to_string(child)) != std::string::npos);
  CHECK(message.find(std::string("host ") + host) != std::string::npos);
  CHECK(message.find("since ") != std::string::npos);
  CHECK(message.find(dir) != std::string::npos);
  CHECK(message.find('\n') == std::string::npos);

  // SIGKILL: no destructor runs, the file still names the dead process, the lock is free.
  holder.kill_and_reap();
  const int status = holder.wait();
  REQUIRE(WIFSIGNALED(status));
  CHECK(read_lines(RunDirLock::lock_path(dir)).at(0).find("pid " + std::to_string(child)) == 0);
  {
    RunDirLock taken = RunDirLock::acquire(dir);
    const auto lines = read_lines(RunDirLock::lock_path(dir));
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("pid " + std::to_string(::getpid()) + " ") == 0);
    // Within one process too, one writer: a second lock is refused.
    try {
      RunDirLock again = RunDirLock::acquire(dir);
      FAIL("a second lock in the same process");
    } catch (const RunDirBusy& e) {
      CHECK(std::string(e.what()).find("(this process)") != std::string::npos);
    }
    RunDirLock moved = std::move(taken);  // moving keeps the lock
    CHECK_THROWS_AS(RunDirLock::acquire(dir), RunDirBusy);
  }
  // A clean release empties the file, so it never names a process that is not holding it.
  CHECK(fs::file_size(RunDirLock::lock_path(dir)) == 0);
  CHECK_NOTHROW(RunDirLock::acquire(dir));
}
