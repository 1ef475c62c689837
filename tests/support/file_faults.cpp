#include "support/file_faults.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <stdexcept>

namespace engine::file_faults {

namespace {

// Installed on the first ScopedFault and never removed nor destroyed, so that a call in
// flight on another thread when a fault ends still finds it; disarmed, it forwards to the
// POSIX calls after one relaxed atomic load.
class FaultyFileOps final : public file_ops::FileOps {
 public:
  void arm(const Fault& fault) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (armed_.load()) throw std::logic_error("file_faults::ScopedFault: a fault is already armed");
    active_ = fault;
    seen_ = failed_ = 0;
    armed_.store(true);
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_.store(false);
  }
  int failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_;
  }

  int create(const std::string& path) override { return fails(Step::Create) ? -1 : real().create(path); }
  ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) override {
    return fails(Step::Write) ? -1 : real().pwrite(fd, data, n, offset);
  }
  int fsync(int fd) override { return fails(Step::Fsync) ? -1 : real().fsync(fd); }
  int close(int fd) override {
    if (fails(Step::Close)) {
      const int err = errno;
      real().close(fd);  // a failed close still closes the descriptor
      errno = err;
      return -1;
    }
    return real().close(fd);
  }
  int rename(const std::string& from, const std::string& to) override {
    return fails(Step::Rename) ? -1 : real().rename(from, to);
  }
  int fsync_dir(const std::string& dir) override { return fails(Step::DirFsync) ? -1 : real().fsync_dir(dir); }

 private:
  static file_ops::FileOps& real() { return file_ops::posix(); }
  // Whether this call of `step` is to fail; sets errno when it is.
  bool fails(Step step) {
    if (!armed_.load(std::memory_order_relaxed)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!armed_.load(std::memory_order_relaxed) || active_.step != step) return false;
    const int call = seen_++;
    if (call < active_.skip || (active_.times >= 0 && call >= active_.skip + active_.times)) return false;
    ++failed_;
    errno = active_.error;
    return true;
  }

  std::atomic<bool> armed_{false};
  mutable std::mutex mutex_;
  Fault active_;    // guarded by mutex_
  int seen_ = 0;    // calls of active_.step so far
  int failed_ = 0;  // of which failed
};

FaultyFileOps& faulty() {
  static FaultyFileOps* ops = [] {
    auto* made = new FaultyFileOps;  // never freed: see FaultyFileOps
    file_ops::install(made);
    return made;
  }();
  return *ops;
}

}  // namespace

ScopedFault::ScopedFault(const Fault& fault) { faulty().arm(fault); }
ScopedFault::~ScopedFault() { faulty().disarm(); }
int ScopedFault::injected() const { return faulty().failed(); }

}  // namespace engine::file_faults
