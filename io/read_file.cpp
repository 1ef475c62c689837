#include "io/read_file.h"

#include <cerrno>
#include <vector>

namespace engine {

int read_file_in_pieces(Env& env, const std::string& path, std::size_t piece,
                        const std::function<void(const char* data, std::size_t n)>& take) {
  const int fd = env.open_for_reading(path);
  if (fd < 0) return errno;
  std::vector<char> buf(piece);
  off_t offset = 0;
  int err = 0;
  for (;;) {
    const ssize_t n = env.pread(fd, buf.data(), buf.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    take(buf.data(), static_cast<std::size_t>(n));
    offset += n;
  }
  env.close(fd);
  return err;
}

int read_whole_file(Env& env, const std::string& path, std::string& content) {
  content.clear();
  return read_file_in_pieces(env, path, std::size_t(1) << 16,
                             [&](const char* data, std::size_t n) { content.append(data, n); });
}

}  // namespace engine
