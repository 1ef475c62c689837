#include "engine/run_lock.h"
#include "core/utc_time.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

namespace engine {

namespace {

std::string holder_text() {
  char host[256] = "?";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  host[sizeof host - 1] = '\0';
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + utc_now(UtcFormat::Readable);
}

// What the holder wrote, up to the first newline ("" when it has not written yet).
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<std::size_t>(n));
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

std::string RunDirLock::lock_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / ".lock").string();
}

RunDirLock RunDirLock::acquire(const std::string& run_dir) {
  const std::string path = lock_path(run_dir);
  // O_CLOEXEC: a program the trainer starts must not inherit (and keep) the lock.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot open the run directory's lock file: " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      throw std::runtime_error(path + ": cannot lock the run directory: " + std::strerror(err));
    }
    // The holder writes its name right after taking the lock; give it a moment.
    std::string holder = read_holder(fd);
    for (int i = 0; i < 20 && holder.empty(); ++i) {
      ::usleep(5000);
      holder = read_holder(fd);
    }
    ::close(fd);
    if (holder.empty()) holder = "another process (it has not written its name yet)";
    if (holder.find("pid " + std::to_string(::getpid()) + " ") == 0) holder += " (this process)";
    throw RunDirBusy(run_dir + " is in use by another training run: " + holder + " (lock " + path +
                     "); wait for it to end or stop it first");
  }
  // We hold the lock: whatever the file says is about a holder that is gone.
  const std::string text = holder_text() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot write the run directory's lock file: " + std::strerror(err));
  }
  return RunDirLock(fd, run_dir);
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), dir_(std::move(other.dir_)) {}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    dir_ = std::move(other.dir_);
  }
  return *this;
}

RunDirLock::~RunDirLock() { release(); }

void RunDirLock::release() noexcept {
  if (fd_ < 0) return;
  // Empty the file first, so it never names a process that no longer holds the lock.
  (void)::ftruncate(fd_, 0);
  ::close(fd_);  // closing the only descriptor releases the flock
  fd_ = -1;
}

}  // namespace engine
