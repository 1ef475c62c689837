// Private to io/ (and the tests): the system calls through which a file is replaced
// (io/atomic_file.cpp), behind an interface in the manner of LevelDB's Env. The library
// has one implementation, the plain POSIX calls; a test installs its own as the process
// default (tests/support/file_faults.h makes any step fail with a chosen errno). The
// default is process-wide because saves run on the writer thread too.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace engine::file_ops {

// The steps of a file replacement, in order.
enum class Step { Create, Write, Fsync, Close, Rename, DirFsync };
const char* step_name(Step step);  // "create", "write", ...

// Like the system calls (-1 and errno on failure, EINTR retried where it can be).
class FileOps {
 public:
  virtual ~FileOps() = default;
  virtual int create(const std::string& path) = 0;  // open(O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)
  virtual ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) = 0;
  virtual int fsync(int fd) = 0;
  virtual int close(int fd) = 0;  // the descriptor is closed even when this fails
  virtual int rename(const std::string& from, const std::string& to) = 0;
  // Opens `dir`, fsyncs it and closes it; 0 or -1 and errno.
  virtual int fsync_dir(const std::string& dir) = 0;
};

// The real system calls.
FileOps& posix();
// The process default: posix() unless another was installed.
FileOps& current();
// Installs `ops` as the process default (nullptr: posix()) and returns the previous one.
// `ops` must outlive every call made through it, on every thread.
FileOps* install(FileOps* ops);

// What io/ calls: the process default's operations.
inline int create(const std::string& path) { return current().create(path); }
inline ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) {
  return current().pwrite(fd, data, n, offset);
}
inline int fsync(int fd) { return current().fsync(fd); }
inline int close(int fd) { return current().close(fd); }
inline int rename(const std::string& from, const std::string& to) { return current().rename(from, to); }
inline int fsync_dir(const std::string& dir) { return current().fsync_dir(dir); }

}  // namespace engine::file_ops
