#include "engine/io/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace engine {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr int64_t kMaxCount = 100'000'000;
constexpr int kMaxSide = 4096;
constexpr int kNumClasses = 10;

const char* const kInstallHint = "install the dataset with: apt-get install dataset-fashion-mnist (as root, or with sudo)";

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

uint32_t big_endian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// gzread reads plain files as they are, so one path serves .gz and uncompressed files.
class IdxFile {
 public:
  // Opened without blocking (a FIFO with no writer would wait forever) and checked to be
  // a regular file before zlib sees it; nothing leaks when it is refused.
  explicit IdxFile(std::string path) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const int saved_errno = errno;
    if (!regular || ::fcntl(fd, F_SETFL, O_RDONLY) != 0) {
      ::close(fd);
      fail(regular ? std::string("cannot open: ") + std::strerror(saved_errno)
                   : S_ISDIR(st.st_mode) ? std::string("is a directory, not a file")
                                         : std::string("not a regular file (a FIFO, socket or device)"));
    }
    errno = 0;
    file_ = gzdopen(fd, "rb");
    if (!file_) {
      ::close(fd);
      fail(std::string("cannot open: ") + (errno ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(file_, 1 << 17);
  }
  ~IdxFile() {
    if (file_) gzclose(file_);
  }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  [[noreturn]] void fail(const std::string& message) const { throw DataError(path_ + ": " + message); }

  // Reads up to n bytes; returns how many arrived. Fewer than n means the file ended (or the
  // gzip stream stopped early, which is the same truncation to the caller). A corrupt gzip
  // stream is an error of its own.
  size_t read_some(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
      const int r = gzread(file_, dst + got, chunk);
      if (r < 0) gzip_failure();
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < n) {
      int errnum = Z_OK;
      gzerror(file_, &errnum);
      // Z_BUF_ERROR is zlib's "unexpected end of file": a truncated .gz, reported by the
      // caller as missing bytes. Anything else means the data is corrupt.
      if (errnum != Z_OK && errnum != Z_BUF_ERROR) gzip_failure();
    }
    return got;
  }

  // Reads exactly n bytes of `what` into dst, or fails saying how many were missing.
  void read_exact(uint8_t* dst, size_t n, size_t already, const std::string& what) {
    const size_t got = read_some(dst, n);
    if (got < n)
      fail("truncated " + what + ": expected " + std::to_string(already + n) + " bytes, found " +
           std::to_string(already + got));
  }

  // The payload is read in slices so a header that overstates the count costs only the
  // bytes actually present, not an allocation of the claimed size.
  std::vector<uint8_t> read_payload(size_t n, size_t header_bytes, const std::string& what) {
    constexpr size_t kSlice = size_t{1} << 24;
    std::vector<uint8_t> data;
    data.reserve(std::min(n, size_t{1} << 26));
    while (data.size() < n) {
      const size_t before = data.size();
      const size_t want = std::min(kSlice, n - before);
      data.resize(before + want);
      const size_t got = read_some(data.data() + before, want);
      if (got < want)
        fail("truncated " + what + ": expected " + std::to_string(header_bytes + n) +
             " bytes, found " + std::to_string(header_bytes + before + got));
    }
    uint8_t extra = 0;
    if (read_some(&extra, 1) != 0)
      fail("unexpected data after the " + std::to_string(header_bytes + n) +
           " bytes that the header declares");
    return data;
  }

  void check_magic(uint32_t expected, const char* kind) {
    uint8_t magic[4];
    read_exact(magic, 4, 0, "header");
    const uint32_t found = big_endian32(magic);
    if (found != expected)
      fail("wrong magic number: expected " + hex32(expected) + " (" + kind + "), found " +
           hex32(found));
  }

 private:
  [[noreturn]] void gzip_failure() {
    const int saved_errno = errno;
    int errnum = Z_OK;
    std::string message = gzerror(file_, &errnum);
    if (errnum == Z_ERRNO) fail(std::string("cannot read: ") + std::strerror(saved_errno));
    // zlib prefixes its messages with the path, which fail() adds already.
    const std::string prefix = path_ + ": ";
    if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
    fail("corrupt gzip data: " + (message.empty() ? std::string("unknown error") : message));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  IdxFile file(path);
  file.check_magic(kImagesMagic, "IDX image file");
  uint8_t dims[12];
  file.read_exact(dims, sizeof dims, 4, "header");
  const uint32_t count = big_endian32(dims);
  const uint32_t rows = big_endian32(dims + 4);
  const uint32_t cols = big_endian32(dims + 8);
  if (count > kMaxCount || rows < 1 || rows > kMaxSide || cols < 1 || cols > kMaxSide)
    file.fail("implausible header: " + std::to_string(count) + " images of " +
              std::to_string(rows) + "x" + std::to_string(cols) + " (accepted: at most " +
              std::to_string(kMaxCount) + " images, sides 1.." + std::to_string(kMaxSide) + ")");

  IdxImages images;
  images.count = count;
  images.rows = static_cast<int>(rows);
  images.cols = static_cast<int>(cols);
  images.pixels = file.read_payload(size_t{count} * rows * cols, 16, "pixel data");
  return images;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  IdxFile file(path);
  file.check_magic(kLabelsMagic, "IDX label file");
  uint8_t dims[4];
  file.read_exact(dims, sizeof dims, 4, "header");
  const uint32_t count = big_endian32(dims);
  if (count > kMaxCount)
    file.fail("implausible header: " + std::to_string(count) + " labels (accepted: at most " +
              std::to_string(kMaxCount) + ")");
  std::vector<uint8_t> labels = file.read_payload(count, 8, "label data");
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= kNumClasses)
      file.fail("label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                " is not a class index in 0.." + std::to_string(kNumClasses - 1));
  return labels;
}

namespace {

// The plain file if present, else the .gz one.
std::string find_data_file(const std::string& dir, const std::string& base) {
  namespace fs = std::filesystem;
  for (const char* suffix : {"", ".gz"}) {
    const fs::path candidate = fs::path(dir) / (base + suffix);
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  }
  throw DataError("data file '" + base + "' (or '" + base + ".gz') not found in directory '" +
                  dir + "' (key data.dir); " + kInstallHint);
}

void check_pair(const std::string& images_path, const IdxImages& images,
                const std::string& labels_path, const std::vector<uint8_t>& labels) {
  if (images.count == 0) throw DataError(images_path + ": contains no images");
  if (static_cast<size_t>(images.count) != labels.size())
    throw DataError(images_path + " has " + std::to_string(images.count) + " images but " +
                    labels_path + " has " + std::to_string(labels.size()) + " labels");
}

struct FashionFiles {
  std::string train_images, train_labels, test_images, test_labels;
};

// All four files, located before any is read, so a partial install is reported at once.
FashionFiles locate_fashion_mnist(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw DataError("data directory '" + dir + "' not found (key data.dir); " + kInstallHint);
  return FashionFiles{find_data_file(dir, "train-images-idx3-ubyte"), find_data_file(dir, "train-labels-idx1-ubyte"),
                      find_data_file(dir, "t10k-images-idx3-ubyte"), find_data_file(dir, "t10k-labels-idx1-ubyte")};
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  const auto [train_images, train_labels, test_images, test_labels] = locate_fashion_mnist(dir);
  FashionMnist data;
  data.train_images = read_idx_images(train_images);
  data.train_labels = read_idx_labels(train_labels);
  check_pair(train_images, data.train_images, train_labels, data.train_labels);
  data.test_images = read_idx_images(test_images);
  data.test_labels = read_idx_labels(test_labels);
  check_pair(test_images, data.test_images, test_labels, data.test_labels);

  if (data.test_images.rows != data.train_images.rows ||
      data.test_images.cols != data.train_images.cols)
    throw DataError(test_images + ": images are " + std::to_string(data.test_images.rows) + "x" +
                    std::to_string(data.test_images.cols) + " but " + train_images + " has " +
                    std::to_string(data.train_images.rows) + "x" +
                    std::to_string(data.train_images.cols));
  return data;
}

IdxPair load_fashion_mnist_part(const std::string& dir, FashionPart part) {
  const FashionFiles files = locate_fashion_mnist(dir);
  const bool train = part == FashionPart::Train;
  const std::string& images = train ? files.train_images : files.test_images;
  const std::string& labels = train ? files.train_labels : files.test_labels;
  IdxPair p;
  p.images = read_idx_images(images);
  p.labels = read_idx_labels(labels);
  check_pair(images, p.images, labels, p.labels);
  return p;
}

}  // namespace engine
