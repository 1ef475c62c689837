#include "support/checkpoint_testing.h"

#include <fstream>
#include <iterator>

#include "io/aligned_bytes.h"
#include "io/atomic_file.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_header.h"
#include "io/checkpoint_tamper.h"

namespace engine::checkpoint_testing {

using namespace checkpoint_internal;

void save_tampered(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper) {
  save_tampered_impl(path, ckpt, tamper);
}

void reseal(const std::string& path, int64_t format_version) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open to reseal");
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (content.size() < kUserBlockBytes) fail(path, "too short to reseal");
  Bytes bytes(content.size());
  std::memcpy(bytes.data(), content.data(), content.size());
  seal(bytes, format_version);
  atomic_write(path, [&](int fd) { return write_fully_at(fd, bytes.data(), bytes.size(), 0); });
}

}  // namespace engine::checkpoint_testing
