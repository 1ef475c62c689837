// Private to io/ (and the tests): the system calls through which a file is replaced
// (io/atomic_file.cpp), each with a seam that lets a test make it fail with a chosen
// errno: disk full, I/O error, quota, file size limit, at any step of a save. Never
// installed. Disarmed, each seam costs one relaxed atomic load.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace engine::file_ops {

// The steps of a file replacement, in order.
enum class Step { Create, Write, Fsync, Close, Rename, DirFsync };
const char* step_name(Step step);  // "create", "write", ...

// Like the system calls (-1 and errno on failure, EINTR retried where it can be).
int create(const std::string& path);  // open(O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)
ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset);
int fsync(int fd);
int close(int fd);  // the descriptor is closed even when this fails
int rename(const std::string& from, const std::string& to);
// Opens `dir`, fsyncs it and closes it; 0 or -1 and errno.
int fsync_dir(const std::string& dir);

// For tests: while a ScopedFault lives, the `skip`+1-th call of `step` and the
// `times`-1 after it (times < 0: every one after it) fail with `error` without
// reaching the system. One fault at a time, process-wide.
struct Fault {
  Step step = Step::Write;
  int error = 0;
  int skip = 0;
  int times = 1;
};
class ScopedFault {
 public:
  explicit ScopedFault(const Fault& fault);
  ~ScopedFault();
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
  int injected() const;  // how many calls failed so far
};

}  // namespace engine::file_ops
