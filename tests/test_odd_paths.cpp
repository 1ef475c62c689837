// Paths that are not regular files (a directory, a FIFO with no writer, a device) are
// refused by every reader and writer of files, at once and without leaking a descriptor.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "support/error_text.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/idx.h"
#include "io/atomic_file.h"

using namespace engine;
namespace fs = std::filesystem;

namespace {

std::size_t open_descriptors() {
  std::size_t n = 0;
  for (auto it = fs::directory_iterator("/proc/self/fd"); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

using test_support::error_of;

struct OddPaths {
  std::string dir, fifo, device = "/dev/zero";
  OddPaths() {
    dir = test_util::fresh_dir("odd_paths");
    fifo = dir + "/fifo.h5";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  }
};

// Runs `f` under a watchdog: a read that blocks (a FIFO opened without O_NONBLOCK) ends
// the test process with SIGALRM instead of hanging the suite.
std::string refusal(const std::function<void()>& f) {
  alarm(20);
  const std::string msg = error_of(f);
  alarm(0);
  return msg;
}

}  // namespace

TEST_CASE("loading, verifying or inspecting a directory, a FIFO or a device is refused at once") {
  const OddPaths p;
  const std::size_t fds = open_descriptors();
  for (int round = 0; round < 3; ++round) {
    CHECK(refusal([&] { load_checkpoint(p.dir); }) == p.dir + ": is a directory, not a file");
    CHECK(refusal([&] { verify_checkpoint_file(p.fifo); }) == p.fifo + ": not a regular file (a FIFO, socket or device)");
    CHECK(refusal([&] { inspect_checkpoint(p.device); }) == p.device + ": not a regular file (a FIFO, socket or device)");
    CHECK(refusal([&] { diff_checkpoints(p.fifo, p.dir); }) == p.fifo + ": not a regular file (a FIFO, socket or device)");
    CHECK(refusal([&] { load_checkpoint(p.dir + "/missing.h5"); }) ==
          p.dir + "/missing.h5: cannot open: No such file or directory");
  }
  CHECK(open_descriptors() == fds);
}

TEST_CASE("saving over a directory, a FIFO or a device is refused and leaves it alone") {
  const OddPaths p;
  Checkpoint c;
  c.meta.saved_on = "cpu";
  for (const std::string& g : checkpoint_required_groups()) c.groups[g];
  const std::size_t fds = open_descriptors();
  CHECK(refusal([&] { save_checkpoint(p.fifo, c); }) == p.fifo + ": not a regular file (a FIFO, socket or device)");
  CHECK(refusal([&] { save_checkpoint(p.device, c); }) == p.device + ": not a regular file (a FIFO, socket or device)");
  CHECK(refusal([&] { write_file_atomically(Env::posix(), p.fifo, "x\n"); }) ==
        p.fifo + ": not a regular file (a FIFO, socket or device)");
  CHECK(open_descriptors() == fds);
  struct stat st {};
  REQUIRE(stat(p.fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  std::size_t entries = 0;
  for (auto it = fs::directory_iterator(p.dir); it != fs::directory_iterator(); ++it) ++entries;
  CHECK(entries == 1);  // the FIFO, and no temporary file
}

TEST_CASE("the IDX reader refuses a directory, a FIFO or a device at once") {
  const OddPaths p;
  const std::size_t fds = open_descriptors();
  for (int round = 0; round < 3; ++round) {
    CHECK(refusal([&] { read_idx_images(p.dir); }) == p.dir + ": is a directory, not a file");
    CHECK(refusal([&] { read_idx_labels(p.fifo); }) == p.fifo + ": not a regular file (a FIFO, socket or device)");
    CHECK(refusal([&] { read_idx_images(p.device); }) == p.device + ": not a regular file (a FIFO, socket or device)");
    CHECK(refusal([&] { read_idx_labels(p.dir + "/missing"); }) == p.dir + "/missing: cannot open: No such file or directory");
  }
  CHECK(open_descriptors() == fds);
}
