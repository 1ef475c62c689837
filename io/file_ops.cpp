#include "io/file_ops.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace engine::file_ops {

namespace {

class PosixFileOps final : public FileOps {
 public:
  int create(const std::string& path) override {
    int fd;
    do fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    while (fd < 0 && errno == EINTR);
    return fd;
  }
  ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) override {
    return ::pwrite(fd, data, n, offset);
  }
  int fsync(int fd) override { return ::fsync(fd); }
  int close(int fd) override { return ::close(fd); }
  int rename(const std::string& from, const std::string& to) override { return ::rename(from.c_str(), to.c_str()); }
  int fsync_dir(const std::string& dir) override {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    errno = err;
    return rc;
  }
};

std::atomic<FileOps*> installed{nullptr};

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

FileOps& posix() {
  static PosixFileOps ops;
  return ops;
}

FileOps& current() {
  FileOps* ops = installed.load(std::memory_order_acquire);
  return ops ? *ops : posix();
}

FileOps* install(FileOps* ops) {
  FileOps* previous = installed.exchange(ops == &posix() ? nullptr : ops, std::memory_order_acq_rel);
  return previous ? previous : &posix();
}

}  // namespace engine::file_ops
