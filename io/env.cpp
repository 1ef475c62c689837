// Env::posix(): the system calls and clocks behind include/engine/io/env.h.
#include "engine/io/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <system_error>

namespace engine {

namespace {

FileInfo info_of(const struct stat& st) {
  FileInfo info;
  info.kind = S_ISREG(st.st_mode) ? FileKind::Regular : S_ISDIR(st.st_mode) ? FileKind::Directory : FileKind::Other;
  info.size = static_cast<std::size_t>(st.st_size);
  info.modified = std::chrono::system_clock::from_time_t(st.st_mtime);
  return info;
}

class PosixEnv final : public Env {
 public:
  int create(const std::string& path, mode_t mode) override {
    int fd;
    do fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
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

  int open_for_reading(const std::string& path) override {
    return ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  }
  int fstat(int fd, FileInfo& info) override {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return -1;
    info = info_of(st);
    return 0;
  }
  ssize_t pread(int fd, void* data, std::size_t n, off_t offset) override { return ::pread(fd, data, n, offset); }

  int open_for_appending(const std::string& path) override {
    int fd;
    do fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    while (fd < 0 && errno == EINTR);
    return fd;
  }

  int stat(const std::string& path, FileInfo& info) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return -1;
    info = info_of(st);
    return 0;
  }
  int link(const std::string& from, const std::string& to) override { return ::link(from.c_str(), to.c_str()); }
  int remove(const std::string& path) override { return ::unlink(path.c_str()); }
  int list_dir(const std::string& dir, std::vector<std::string>& names) override {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return -1;
    names.clear();
    int err = 0;
    for (;;) {
      errno = 0;  // readdir's null is the end, or a failure that sets errno
      const dirent* e = ::readdir(d.get());
      if (!e) {
        err = errno;
        break;
      }
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    d.reset();
    errno = err;
    return err == 0 ? 0 : -1;
  }
  int make_dirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (!ec) return 0;
    errno = ec.value();
    return -1;
  }

  int open_lock_file(const std::string& path) override {
    return ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  }
  int try_lock(int fd) override { return ::flock(fd, LOCK_EX | LOCK_NB); }
  int truncate(int fd, off_t size) override { return ::ftruncate(fd, size); }

  std::chrono::system_clock::time_point wall_now() override { return std::chrono::system_clock::now(); }
  std::chrono::steady_clock::time_point monotonic_now() override { return std::chrono::steady_clock::now(); }
};

}  // namespace

Env& Env::posix() {
  static PosixEnv* const env = new PosixEnv;  // never destroyed: removals still run at exit
  return *env;
}

}  // namespace engine
