#include "engine/run/run_lock.h"
#include "core/utc_time.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace engine {

namespace {

std::string holder_text(Env& env) {
  char host[256] = "?";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  host[sizeof host - 1] = '\0';
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " +
         utc_text(env.wall_now(), UtcFormat::Readable);
}

// What the holder wrote, up to the first newline ("" when it has not written yet).
std::string read_holder(Env& env, int fd) {
  char buf[512];
  const ssize_t n = env.pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<std::size_t>(n));
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

std::string RunDirLock::lock_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / ".lock").string();
}

RunDirLock RunDirLock::acquire(const std::string& run_dir, Env* env_given) {
  Env& env = env_or_posix(env_given);
  const std::string path = lock_path(run_dir);
  // Opened O_CLOEXEC: a program the trainer starts must not inherit (and keep) the lock.
  const int fd = env.open_lock_file(path);
  if (fd < 0) throw std::runtime_error(path + ": cannot open the run directory's lock file: " + std::strerror(errno));
  if (env.try_lock(fd) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      env.close(fd);
      throw std::runtime_error(path + ": cannot lock the run directory: " + std::strerror(err));
    }
    // The holder writes its name right after taking the lock; give it a moment.
    std::string holder = read_holder(env, fd);
    for (int i = 0; i < 20 && holder.empty(); ++i) {
      ::usleep(5000);
      holder = read_holder(env, fd);
    }
    env.close(fd);
    if (holder.empty()) holder = "another process (it has not written its name yet)";
    if (holder.find("pid " + std::to_string(::getpid()) + " ") == 0) holder += " (this process)";
    throw RunDirBusy(run_dir + " is in use by another training run: " + holder + " (lock " + path +
                     "); wait for it to end or stop it first");
  }
  // We hold the lock: whatever the file says is about a holder that is gone.
  const std::string text = holder_text(env) + "\n";
  if (env.truncate(fd, 0) != 0 || env.pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    env.close(fd);
    throw std::runtime_error(path + ": cannot write the run directory's lock file: " + std::strerror(err));
  }
  return RunDirLock(env, fd, run_dir);
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept
    : env_(other.env_), fd_(std::exchange(other.fd_, -1)), dir_(std::move(other.dir_)) {}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    release();
    env_ = other.env_;
    fd_ = std::exchange(other.fd_, -1);
    dir_ = std::move(other.dir_);
  }
  return *this;
}

RunDirLock::~RunDirLock() { release(); }

void RunDirLock::release() noexcept {
  if (fd_ < 0) return;
  // Empty the file first, so it never names a process that no longer holds the lock.
  (void)env_->truncate(fd_, 0);
  env_->close(fd_);  // closing the only descriptor releases the flock
  fd_ = -1;
}

}  // namespace engine
