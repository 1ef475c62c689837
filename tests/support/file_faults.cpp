#include "support/file_faults.h"

#include <cerrno>
#include <stdexcept>

#include "io/deferred_remove.h"

namespace engine::file_faults {

const char* step_name(Step step) {
  switch (step) {
    case Step::Create: return "create";
    case Step::Write: return "write";
    case Step::Fsync: return "fsync";
    case Step::Close: return "close";
    case Step::Rename: return "rename";
    case Step::DirFsync: return "directory fsync";
    case Step::OpenForReading: return "open for reading";
    case Step::Fstat: return "fstat";
    case Step::Read: return "read";
    case Step::Stat: return "stat";
    case Step::Link: return "link";
    case Step::Remove: return "remove";
    case Step::ListDir: return "list directory";
    case Step::MakeDirs: return "make directories";
    case Step::OpenLockFile: return "open lock file";
    case Step::Lock: return "lock";
    case Step::Truncate: return "truncate";
    case Step::OpenForAppending: return "open for appending";
  }
  return "unknown";
}

FaultyEnv::~FaultyEnv() { finish_pending_removals(*this); }

void FaultyEnv::arm(const Fault& fault) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_.load()) throw std::logic_error("file_faults::ScopedFault: a fault is already armed");
  active_ = fault;
  seen_ = failed_ = 0;
  armed_.store(true);
}

void FaultyEnv::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_.store(false);
}

int FaultyEnv::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

bool FaultyEnv::fails(Step step, const std::string& path, const std::string& other_path) {
  if (!armed_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_.load(std::memory_order_relaxed) || active_.step != step) return false;
  const std::string& part = active_.path_part;
  if (!part.empty() && path.find(part) == std::string::npos &&
      (other_path.empty() || other_path.find(part) == std::string::npos))
    return false;
  const int call = seen_++;
  if (call < active_.skip || (active_.times >= 0 && call >= active_.skip + active_.times)) return false;
  ++failed_;
  errno = active_.error;
  return true;
}

bool FaultyEnv::fails_on(Step step, int fd) {
  if (!armed_.load(std::memory_order_relaxed)) return false;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = fd_paths_.find(fd);
    if (it != fd_paths_.end()) path = it->second;
  }
  return fails(step, path);
}

int FaultyEnv::opened(int fd, const std::string& path) {
  if (fd >= 0) {
    const int err = errno;
    std::lock_guard<std::mutex> lock(mutex_);
    fd_paths_[fd] = path;
    errno = err;
  }
  return fd;
}

int FaultyEnv::create(const std::string& path, mode_t mode) {
  return fails(Step::Create, path) ? -1 : opened(EnvWrapper::create(path, mode), path);
}
ssize_t FaultyEnv::pwrite(int fd, const void* data, std::size_t n, off_t offset) {
  return fails_on(Step::Write, fd) ? -1 : EnvWrapper::pwrite(fd, data, n, offset);
}
int FaultyEnv::fsync(int fd) { return fails_on(Step::Fsync, fd) ? -1 : EnvWrapper::fsync(fd); }
int FaultyEnv::close(int fd) {
  const bool fail = fails_on(Step::Close, fd);
  const int err = errno;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fd_paths_.erase(fd);
  }
  const int rc = EnvWrapper::close(fd);  // a failed close still closes the descriptor
  if (!fail) return rc;
  errno = err;
  return -1;
}
int FaultyEnv::rename(const std::string& from, const std::string& to) {
  return fails(Step::Rename, from, to) ? -1 : EnvWrapper::rename(from, to);
}
int FaultyEnv::fsync_dir(const std::string& dir) {
  return fails(Step::DirFsync, dir) ? -1 : EnvWrapper::fsync_dir(dir);
}
int FaultyEnv::open_for_reading(const std::string& path) {
  return fails(Step::OpenForReading, path) ? -1 : opened(EnvWrapper::open_for_reading(path), path);
}
int FaultyEnv::open_for_appending(const std::string& path) {
  return fails(Step::OpenForAppending, path) ? -1 : opened(EnvWrapper::open_for_appending(path), path);
}
int FaultyEnv::fstat(int fd, FileInfo& info) { return fails_on(Step::Fstat, fd) ? -1 : EnvWrapper::fstat(fd, info); }
ssize_t FaultyEnv::pread(int fd, void* data, std::size_t n, off_t offset) {
  return fails_on(Step::Read, fd) ? -1 : EnvWrapper::pread(fd, data, n, offset);
}
int FaultyEnv::stat(const std::string& path, FileInfo& info) {
  return fails(Step::Stat, path) ? -1 : EnvWrapper::stat(path, info);
}
int FaultyEnv::link(const std::string& from, const std::string& to) {
  return fails(Step::Link, from, to) ? -1 : EnvWrapper::link(from, to);
}
int FaultyEnv::remove(const std::string& path) { return fails(Step::Remove, path) ? -1 : EnvWrapper::remove(path); }
int FaultyEnv::list_dir(const std::string& dir, std::vector<std::string>& names) {
  return fails(Step::ListDir, dir) ? -1 : EnvWrapper::list_dir(dir, names);
}
int FaultyEnv::make_dirs(const std::string& dir) {
  return fails(Step::MakeDirs, dir) ? -1 : EnvWrapper::make_dirs(dir);
}
int FaultyEnv::open_lock_file(const std::string& path) {
  return fails(Step::OpenLockFile, path) ? -1 : opened(EnvWrapper::open_lock_file(path), path);
}
int FaultyEnv::try_lock(int fd) { return fails_on(Step::Lock, fd) ? -1 : EnvWrapper::try_lock(fd); }
int FaultyEnv::truncate(int fd, off_t size) { return fails_on(Step::Truncate, fd) ? -1 : EnvWrapper::truncate(fd, size); }

ScopedFault::ScopedFault(FaultyEnv& env, const Fault& fault) : env_(env) { env_.arm(fault); }
ScopedFault::~ScopedFault() { env_.disarm(); }
int ScopedFault::injected() const { return env_.failed(); }

}  // namespace engine::file_faults
