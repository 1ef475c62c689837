// Helpers shared by the libFuzzer harnesses: hand the fuzz input to the engine as a file
// (the public API takes paths), and reseal an engine checkpoint's user-block header
// exactly as docs/checkpoint-format.md section 1.1 describes, so that mutations of the
// HDF5 payload get past the checksums and reach the parser.
#pragma once
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace fuzz {

// The engine's refusal of a bad input is one non-empty line that starts with `prefix`
// (the file's path, or the path and ": "); anything else aborts, for libFuzzer to keep
// the input.
inline void require_one_line(const std::string& what, const std::string& prefix) {
  if (what.empty() || what.rfind(prefix, 0) != 0 || what.find('\n') != std::string::npos) {
    std::cerr << "rejection is not one line starting with [" << prefix << "]: [" << what << "]\n";
    std::abort();
  }
}

// An anonymous in-memory file, reachable by path as /proc/self/fd/N: no disk I/O and
// nothing left behind when the fuzzer is killed.
class MemFile {
 public:
  MemFile() {
    fd_ = memfd_create("fuzz-input", 0);
    if (fd_ < 0) { std::perror("memfd_create"); std::abort(); }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the content with `data`.
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || lseek(fd_, 0, SEEK_SET) != 0) { std::perror("memfd reset"); std::abort(); }
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) { std::perror("memfd write"); std::abort(); }
      done += static_cast<size_t>(n);
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

inline uint32_t crc32_of(const uint8_t* data, size_t size) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // zlib takes uInt lengths
    const uInt n = size > (1u << 30) ? (1u << 30) : static_cast<uInt>(size);
    c = crc32(c, data, n);
    data += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

inline constexpr size_t kUserBlock = 512;
inline constexpr char kMagic[] = "ENGINE-CHECKPOINT\n";

inline bool looks_like_checkpoint(const uint8_t* data, size_t size) {
  return size >= kUserBlock && std::memcmp(data, kMagic, sizeof kMagic - 1) == 0;
}

// The decimal value of `key` in the header text, or `fallback`.
inline long long header_value(const uint8_t* data, size_t size, const char* key, long long fallback) {
  const std::string text(reinterpret_cast<const char*>(data), size < kUserBlock ? size : kUserBlock);
  const std::string needle = std::string("\n") + key + " ";
  const auto at = text.find(needle);
  if (at == std::string::npos) return fallback;
  return std::strtoll(text.c_str() + at + needle.size(), nullptr, 10);
}

// Rewrites bytes [0, 512) of a checkpoint of `size` bytes as a valid version-2 header for
// the payload that follows: payload_bytes = size - 512, metadata_bytes as given (clamped
// to the payload), and all three checksums recomputed. Returns false when the buffer is
// too small to hold a header.
inline bool reseal(uint8_t* data, size_t size, long long metadata_bytes, long long format_version = 2) {
  if (size < kUserBlock) return false;
  const size_t payload = size - kUserBlock;
  if (metadata_bytes < 0 || static_cast<size_t>(metadata_bytes) > payload) metadata_bytes = static_cast<long long>(payload);
  const uint8_t* p = data + kUserBlock;
  char text[kUserBlock];
  int n = std::snprintf(text, sizeof text,
                        "ENGINE-CHECKPOINT\nformat_version %lld\nuserblock_bytes 512\npayload_bytes %zu\n"
                        "metadata_bytes %lld\nmetadata_crc32 %08x\npayload_crc32 %08x\n",
                        format_version, payload, metadata_bytes,
                        crc32_of(p, static_cast<size_t>(metadata_bytes)), crc32_of(p, payload));
  const uint32_t hcrc = crc32_of(reinterpret_cast<const uint8_t*>(text), static_cast<size_t>(n));
  n += std::snprintf(text + n, sizeof text - n, "header_crc32 %08x\n", hcrc);
  std::memset(data, 0, kUserBlock);
  std::memcpy(data, text, static_cast<size_t>(n));
  return true;
}

}  // namespace fuzz
