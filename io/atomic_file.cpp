// Replacing a file atomically and durably: a temporary file in the same directory,
// written, fsynced, renamed over the target, and the directory fsynced.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/checkpoint.h"
#include "io/deferred_remove.h"

namespace engine {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& msg) { throw CheckpointError(path + ": " + msg); }

}  // namespace

// pwrite of all `n` bytes at `offset`; 0 or the errno of the failure.
int write_fully_at(int fd, const unsigned char* data, std::size_t n, off_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<std::size_t>(w);
    offset += w;
  }
  return 0;
}

// Writes a new file under `path` atomically: `write_content(fd)` fills a temporary
// file in the same directory (returning 0 or an errno), which is fsynced, renamed over
// `path`, and the directory fsynced.
void atomic_write(const std::string& path, const std::function<int(int)>& write_content) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) fail(path, "not a file path");
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string tmp = prefix + "." + name + ".tmp." + std::to_string(getpid());
  sweep_leftovers_once(dir);

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail(path, "cannot create temporary file " + tmp + ": " + std::strerror(errno));
  const char* step = nullptr;
  int err = 0;
  if ((err = write_content(fd)) != 0) step = "write";
  else if (::fsync(fd) != 0) step = "fsync", err = errno;
  if (::close(fd) != 0 && !step) step = "close", err = errno;
  // The version being replaced keeps a hidden link until the rename is done, so that
  // freeing it happens on the background remover instead of here.
  std::string replaced;
  if (!step) {
    replaced = replaced_version_name(prefix, name);
    if (::link(path.c_str(), replaced.c_str()) != 0) replaced.clear();  // no old version, or no hard links
  }
  if (!step && ::rename(tmp.c_str(), path.c_str()) != 0) step = "rename", err = errno;
  if (!replaced.empty()) remove_later(replaced);
  if (step) {
    ::unlink(tmp.c_str());
    fail(path, std::string("cannot ") + step + " temporary file " + tmp + ": " + std::strerror(err));
  }
  // Makes the rename itself durable. Some filesystems cannot fsync a directory; the
  // new file is in place by now either way.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(path, "saved, but cannot open directory " + dir + " to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(dfd);
  err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL && err != ENOTSUP && err != EROFS)
    fail(path, "saved, but cannot fsync directory " + dir + ": " + std::strerror(err));
}

}  // namespace engine
