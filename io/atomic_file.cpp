// Replacing a file atomically and durably: a temporary file in the same directory,
// written, fsynced, renamed over the target, and the directory fsynced. Every system call
// goes through the caller's Env (engine/io/env.h), so that tests can make any step fail.
#include "io/atomic_file.h"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/io/checkpoint.h"
#include "io/deferred_remove.h"

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

int write_fully_at(Env& env, int fd, const unsigned char* data, std::size_t n, off_t offset) {
  while (n > 0) {
    const ssize_t w = env.pwrite(fd, data, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<std::size_t>(w);
    offset += w;
  }
  return 0;
}

namespace {

// Env::posix() lives as long as the process; another Env may be gone once the call that
// was given it returns, so the removals queued through it finish first.
class RemovalsFinishedOnReturn {
 public:
  explicit RemovalsFinishedOnReturn(const Env& env) : env_(env) {}
  ~RemovalsFinishedOnReturn() {
    if (&env_ != &Env::posix()) finish_pending_removals(env_);
  }
  RemovalsFinishedOnReturn(const RemovalsFinishedOnReturn&) = delete;
  RemovalsFinishedOnReturn& operator=(const RemovalsFinishedOnReturn&) = delete;

 private:
  const Env& env_;
};

}  // namespace

void atomic_write(Env& env, const std::string& path, const std::function<int(int)>& write_content) {
  const ScopedSigxfszBlock no_sigxfsz;  // EFBIG, not death, past `ulimit -f`
  const RemovalsFinishedOnReturn removals_finished(env);
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) fail(path, "not a file path");
  // Only a regular file is ever replaced: renaming over a FIFO or a device would take a
  // name the user meant for something else (a directory fails the rename anyway).
  FileInfo existing;
  if (env.stat(path, existing) == 0 && existing.kind != FileKind::Regular)
    fail(path, existing.kind == FileKind::Directory ? "is a directory, not a file"
                                                    : "not a regular file (a FIFO, socket or device)");
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string tmp = prefix + "." + name + ".tmp." + std::to_string(getpid());
  sweep_leftovers_once(env, dir);

  const int fd = env.create(tmp, 0666);
  if (fd < 0) fail_write(path, "cannot create temporary file " + tmp + ": " + std::strerror(errno));
  const char* step = nullptr;
  int err = 0;
  if ((err = write_content(fd)) != 0) step = "write";
  else if (env.fsync(fd) != 0) step = "fsync", err = errno;
  if (env.close(fd) != 0 && !step) step = "close", err = errno;
  // The version being replaced keeps a hidden link until the new one is durable, so that
  // a failed directory fsync can put it back, and so that freeing it happens on the
  // background remover instead of here.
  std::string replaced;
  if (!step) {
    replaced = replaced_version_name(prefix, name);
    if (env.link(path, replaced) != 0) replaced.clear();  // no old version, or no hard links
  }
  if (!step && env.rename(tmp, path) != 0) step = "rename", err = errno;
  if (step) {
    env.remove(tmp);
    if (!replaced.empty()) remove_later(env, replaced);
    fail_write(path, std::string("cannot ") + step + " temporary file " + tmp + ": " + std::strerror(err));
  }
  // Makes the rename itself durable. Some filesystems cannot fsync a directory; the new
  // file is in place either way, and then that is as durable as it gets.
  if (env.fsync_dir(dir) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EROFS) {
    err = errno;
    // The rename may or may not reach the disk: put the previous version back, so that a
    // failed save leaves the path as it found it (both versions are complete and fsynced).
    const bool restored = replaced.empty() ? env.remove(path) == 0 : env.rename(replaced, path) == 0;
    if (!restored && !replaced.empty()) remove_later(env, replaced);
    fail_write(path, std::string("cannot fsync directory ") + dir + ": " + std::strerror(err) +
                         (restored ? (replaced.empty() ? " (the new file was removed)" : " (the previous file was put back)")
                                   : " (the new file stays in place)"));
  }
  if (!replaced.empty()) remove_later(env, replaced);
}

void write_file_atomically(Env& env, const std::string& path, const std::string& bytes) {
  atomic_write(env, path, [&](int fd) {
    return write_fully_at(env, fd, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0);
  });
}

}  // namespace engine
