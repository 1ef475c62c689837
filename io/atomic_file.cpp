// Replacing a file atomically and durably: a temporary file in the same directory,
// written, fsynced, renamed over the target, and the directory fsynced. Every system call
// goes through io/file_ops.h, so that tests can make any step fail.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/checkpoint.h"
#include "io/deferred_remove.h"
#include "io/file_ops.h"

namespace engine {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& msg) { throw CheckpointError(path + ": " + msg); }
[[noreturn]] void fail_write(const std::string& path, const std::string& msg) {
  throw CheckpointWriteError(path + ": " + msg);
}

}  // namespace

ScopedSigxfszBlock::ScopedSigxfszBlock() {
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &only, &previous_);
  was_blocked_ = sigismember(&previous_, SIGXFSZ) == 1;
}

ScopedSigxfszBlock::~ScopedSigxfszBlock() {
  if (!was_blocked_) {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1) {
      sigset_t only;
      sigemptyset(&only);
      sigaddset(&only, SIGXFSZ);
      const timespec now{0, 0};
      (void)sigtimedwait(&only, nullptr, &now);
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

int write_fully_at(int fd, const unsigned char* data, std::size_t n, off_t offset) {
  while (n > 0) {
    const ssize_t w = file_ops::pwrite(fd, data, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<std::size_t>(w);
    offset += w;
  }
  return 0;
}

void atomic_write(const std::string& path, const std::function<int(int)>& write_content) {
  const ScopedSigxfszBlock no_sigxfsz;  // EFBIG, not death, past `ulimit -f`
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) fail(path, "not a file path");
  // Only a regular file is ever replaced: renaming over a FIFO or a device would take a
  // name the user meant for something else (a directory fails the rename anyway).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(path, S_ISDIR(st.st_mode) ? "is a directory, not a file" : "not a regular file (a FIFO, socket or device)");
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string tmp = prefix + "." + name + ".tmp." + std::to_string(getpid());
  sweep_leftovers_once(dir);

  const int fd = file_ops::create(tmp);
  if (fd < 0) fail_write(path, "cannot create temporary file " + tmp + ": " + std::strerror(errno));
  const char* step = nullptr;
  int err = 0;
  if ((err = write_content(fd)) != 0) step = "write";
  else if (file_ops::fsync(fd) != 0) step = "fsync", err = errno;
  if (file_ops::close(fd) != 0 && !step) step = "close", err = errno;
  // The version being replaced keeps a hidden link until the new one is durable, so that
  // a failed directory fsync can put it back, and so that freeing it happens on the
  // background remover instead of here.
  std::string replaced;
  if (!step) {
    replaced = replaced_version_name(prefix, name);
    if (::link(path.c_str(), replaced.c_str()) != 0) replaced.clear();  // no old version, or no hard links
  }
  if (!step && file_ops::rename(tmp, path) != 0) step = "rename", err = errno;
  if (step) {
    ::unlink(tmp.c_str());
    if (!replaced.empty()) remove_later(replaced);
    fail_write(path, std::string("cannot ") + step + " temporary file " + tmp + ": " + std::strerror(err));
  }
  // Makes the rename itself durable. Some filesystems cannot fsync a directory; the new
  // file is in place either way, and then that is as durable as it gets.
  if (file_ops::fsync_dir(dir) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EROFS) {
    err = errno;
    // The rename may or may not reach the disk: put the previous version back, so that a
    // failed save leaves the path as it found it (both versions are complete and fsynced).
    const bool restored = replaced.empty() ? ::unlink(path.c_str()) == 0 : ::rename(replaced.c_str(), path.c_str()) == 0;
    if (!restored && !replaced.empty()) remove_later(replaced);
    fail_write(path, std::string("cannot fsync directory ") + dir + ": " + std::strerror(err) +
                         (restored ? (replaced.empty() ? " (the new file was removed)" : " (the previous file was put back)")
                                   : " (the new file stays in place)"));
  }
  if (!replaced.empty()) remove_later(replaced);
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  atomic_write(path, [&](int fd) {
    return write_fully_at(fd, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0);
  });
}

}  // namespace engine
