#include "io/file_ops.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <stdexcept>

namespace engine::file_ops {

namespace {

std::atomic<bool> armed{false};
std::mutex fault_mutex;
Fault active;      // guarded by fault_mutex
int seen = 0;      // calls of active.step so far
int injected_count = 0;  // of which failed

// Whether this call of `step` is to fail; sets errno when it is.
bool fault_at(Step step) {
  if (!armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(fault_mutex);
  if (!armed.load(std::memory_order_relaxed) || active.step != step) return false;
  const int call = seen++;
  if (call < active.skip || (active.times >= 0 && call >= active.skip + active.times)) return false;
  ++injected_count;
  errno = active.error;
  return true;
}

}  // namespace

const char* step_name(Step step) {
  switch (step) {
    case Step::Create: return "create";
    case Step::Write: return "write";
    case Step::Fsync: return "fsync";
    case Step::Close: return "close";
    case Step::Rename: return "rename";
    case Step::DirFsync: return "directory fsync";
  }
  return "unknown";
}

int create(const std::string& path) {
  if (fault_at(Step::Create)) return -1;
  int fd;
  do fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  while (fd < 0 && errno == EINTR);
  return fd;
}

ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) {
  if (fault_at(Step::Write)) return -1;
  return ::pwrite(fd, data, n, offset);
}

int fsync(int fd) {
  if (fault_at(Step::Fsync)) return -1;
  return ::fsync(fd);
}

int close(int fd) {
  if (fault_at(Step::Close)) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return ::close(fd);
}

int rename(const std::string& from, const std::string& to) {
  if (fault_at(Step::Rename)) return -1;
  return ::rename(from.c_str(), to.c_str());
}

int fsync_dir(const std::string& dir) {
  if (fault_at(Step::DirFsync)) return -1;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  errno = err;
  return rc;
}

ScopedFault::ScopedFault(const Fault& fault) {
  std::lock_guard<std::mutex> lock(fault_mutex);
  if (armed.load()) throw std::logic_error("file_ops::ScopedFault: a fault is already armed");
  active = fault;
  seen = injected_count = 0;
  armed.store(true);
}

ScopedFault::~ScopedFault() {
  std::lock_guard<std::mutex> lock(fault_mutex);
  armed.store(false);
}

int ScopedFault::injected() const {
  std::lock_guard<std::mutex> lock(fault_mutex);
  return injected_count;
}

}  // namespace engine::file_ops
