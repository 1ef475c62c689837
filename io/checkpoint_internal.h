// Private to io/: what the checkpoint files share (io/checkpoint_header.cpp,
// checkpoint_writer.cpp, checkpoint_reader.cpp, checkpoint_tools.cpp). Never installed.
// The layout these implement is docs/checkpoint-format.md.
#pragma once
#include <hdf5.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "io/checkpoint_reader.h"
#include "io/checkpoint_tamper.h"

#ifndef ENGINE_VERSION
#define ENGINE_VERSION "0.0.0-dev"  // standalone builds; CMake defines the real one
#endif

// float16 tensors hold raw IEEE half bits in host order and are written as little-endian
// halves without conversion.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint layer assumes a little-endian host");

namespace engine {
namespace checkpoint_internal {

constexpr std::size_t kUserBlockBytes = 512;
constexpr char kMagic[] = "ENGINE-CHECKPOINT\n";
constexpr std::size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
constexpr char kFormatName[] = "engine-checkpoint";
constexpr int kMaxRank = 8;
constexpr uint64_t kMaxElements = uint64_t(1) << 31;
constexpr int kMaxNesting = 16;
// Growth step the core driver asks for when a loaded (read-only, fixed-size) image is
// opened; it never grows, so any value does.
constexpr std::size_t kCoreIncrement = std::size_t(4) << 20;
// Tensor data of at least kAlignThreshold bytes starts on a kDataAlignment boundary in
// the file (the user block is a multiple of it too), and the loader's file buffer is
// kBufferAlignment-aligned, so loaded tensors can point into the buffer (the alignment
// the CPU kernels need) instead of being copied out of it.
constexpr std::size_t kBufferAlignment = 64;
constexpr hsize_t kDataAlignment = 64;
constexpr hsize_t kAlignThreshold = 64;
static_assert(kUserBlockBytes % kDataAlignment == 0, "the user block must keep data aligned");

inline const char* const kRootAttributes[] = {"format",      "format_version", "engine_version",
                                              "created_utc", "saved_on",       "config"};

[[noreturn]] inline void fail(const std::string& path, const std::string& msg) {
  throw CheckpointError(path + ": " + msg);
}

inline std::string corrupt(const std::string& detail) {
  return "checksum mismatch (file is corrupt): " + detail;
}

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Shortest text that reads back as the same double.
inline std::string fmt_double(double v) {
  char buf[40];
  for (int prec = 15; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) break;
  }
  return buf;
}

inline std::string fmt_short(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// A byte buffer that is never zero-filled: every byte is written before it is read
// (file reads, HDF5 images, the sealed header), and 5 MB of memset per save or load
// is measurable. 64-byte aligned, so that tensors can live inside a loaded file.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::size_t n) { resize(n); }
  Bytes(Bytes&& o) noexcept : data_(std::move(o.data_)), size_(o.size_), capacity_(o.capacity_) {
    o.size_ = o.capacity_ = 0;
  }
  Bytes& operator=(Bytes&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = o.size_;
    capacity_ = o.capacity_;
    o.size_ = o.capacity_ = 0;
    return *this;
  }
  unsigned char* data() { return data_.get(); }
  const unsigned char* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  unsigned char* begin() { return data_.get(); }
  // Keeps the first min(size, n) bytes; new bytes are uninitialised.
  void resize(std::size_t n) {
    if (n > capacity_) {
      void* p = std::aligned_alloc(kBufferAlignment, (n + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
      if (!p) throw std::bad_alloc();
      std::unique_ptr<unsigned char[], FreeDeleter> bigger(static_cast<unsigned char*>(p));
      if (size_) std::memcpy(bigger.get(), data_.get(), size_);
      data_ = std::move(bigger);
      capacity_ = n;
    }
    size_ = n;
  }

 private:
  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char[], FreeDeleter> data_;
  std::size_t size_ = 0, capacity_ = 0;
};

// Runs `first` on the calling thread and `second` on a second OpenMP thread when one may
// be had, else one after the other, `first` first (OMP_NUM_THREADS=1, or a region nested
// where only one thread is granted). Neither may throw. Reading with checksumming, and
// walking with reading, go side by side this way.
inline void side_by_side(const std::function<void()>& first, const std::function<void()>& second) {
  if (omp_get_max_threads() < 2) {
    first();
    second();
    return;
  }
#pragma omp parallel num_threads(2)
  {
    for (int task = omp_get_thread_num(); task < 2; task += omp_get_num_threads()) (task == 0 ? first : second)();
  }
}

// ---------------------------------------------------------------------------------
// HDF5 plumbing: quiet errors, owned handles, failures turned into CheckpointError.

inline herr_t take_innermost_error(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err && err->desc) {
    try {
      *static_cast<std::string*>(out) = err->desc;
    } catch (...) {
    }
  }
  return 0;
}

inline std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost_error, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? "" : " (HDF5: " + reason + ")";
}

// Silences HDF5's error printing and disables filter plugins (a file must not make us
// load code) for the duration of one public call, then restores the caller's settings.
class Hdf5Session {
 public:
  Hdf5Session() {
    H5open();
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    have_plugins_ = H5PLget_loading_state(&plugins_) >= 0;
    H5PLset_loading_state(0);
  }
  ~Hdf5Session() {
    if (have_plugins_) H5PLset_loading_state(plugins_);
    H5Eset_auto2(H5E_DEFAULT, func_, data_);
  }
  Hdf5Session(const Hdf5Session&) = delete;
  Hdf5Session& operator=(const Hdf5Session&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
  unsigned plugins_ = 0;
  bool have_plugins_ = false;
};

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }

  hid_t get() const { return id_; }
  // Gives up ownership without closing (the caller closed it or hands it on).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Names the file in every error and checks every HDF5 call.
struct H5Ctx {
  std::string path;

  [[noreturn]] void fail(const std::string& msg) const { checkpoint_internal::fail(path, msg); }
  H5Handle own(hid_t id, H5Handle::Closer close, const std::string& what) const {
    if (id < 0) fail(what + hdf5_reason());
    return H5Handle(id, close);
  }
  void ok(herr_t r, const std::string& what) const {
    if (r < 0) fail(what + hdf5_reason());
  }
  H5Handle copy_type(hid_t predefined) const {
    return own(H5Tcopy(predefined), H5Tclose, "cannot copy an HDF5 datatype");
  }
  H5Handle plist(hid_t cls, const std::string& what) const {
    return own(H5Pcreate(cls), H5Pclose, "cannot create " + what);
  }
};

// ---------------------------------------------------------------------------------
// Datatypes (io/checkpoint_hdf5.cpp).

H5Handle half_type(const H5Ctx& c, bool big_endian);
H5Handle utf8_string_type(const H5Ctx& c);
// File and memory datatypes of a tensor dtype.
H5Handle file_type_of(const H5Ctx& c, DType d);
H5Handle memory_type_of(const H5Ctx& c, DType d);
inline bool type_equals(hid_t a, hid_t b) { return H5Tequal(a, b) > 0; }
std::string describe_type(hid_t t);

// The core driver never touches this name on disk; it only has to be unique among the
// files HDF5 has open in this process.
std::string unique_image_name(const char* role);

// File-image udata is our own object, shared rather than copied by HDF5; HDF5 asks to
// copy the image onto itself when the buffer is ours, which costs nothing.
void* image_udata_share(void* udata);
herr_t image_udata_keep(void*);
void* image_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t, void*);

// ---------------------------------------------------------------------------------
// Keys (io/checkpoint_hdf5.cpp).

std::vector<std::string> split_key(const std::string& key);
void check_name(const std::string& path, const std::string& what, const std::string& key);
inline bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}
// Strips wrapper prefixes from model keys and from the parameter part of optimizer keys;
// two keys becoming one is an error rather than a silent loss.
void normalise_keys(const std::string& path, std::map<std::string, StateDict>& groups);
inline bool is_series(const Scalar& s) { return std::holds_alternative<std::vector<double>>(s); }
// A key names either a dataset (tensor, series) or an attribute; its '/'-prefixes name
// groups. A dataset key that is also a group prefix cannot be stored.
void check_group_keys(const std::string& path, const std::string& group, const StateDict& d);

// ---------------------------------------------------------------------------------
// The integrity header in the user block (io/checkpoint_header.cpp).

// The checksums a header records: of the first metadata_bytes of the payload, and of all
// of it.
struct PayloadChecksums {
  std::size_t metadata_bytes = 0;
  uint32_t metadata_crc = 0, payload_crc = 0;
};
PayloadChecksums checksums_of(const unsigned char* payload, std::size_t payload_bytes, std::size_t metadata_bytes);
// Fills the user block of `image` (layout in docs/checkpoint-format.md, section 1.1).
// Version 1 headers have no metadata lines; tests write them to stand for old files.
void seal_with(Bytes& image, int64_t format_version, const PayloadChecksums& sums);
// Seals with all of the payload counted as metadata: right for any file.
void seal(Bytes& image, int64_t format_version);

struct Header {
  int64_t format_version = 0;
  std::size_t payload_bytes = 0, metadata_bytes = 0;  // version 1: all of the payload is metadata
  uint32_t payload_crc = 0, metadata_crc = 0;
};
// Everything about the header before any payload byte is trusted: magic, header
// checksum, version, fields, length, in that order so each refusal names the real
// problem. `file` holds the first min(size, 512) bytes of a file of `size` bytes; the
// payload checksums are checked by the caller as the payload is read.
Header parse_header(const std::string& path, const unsigned char* file, std::size_t size);

uint32_t crc_join(uint32_t first, uint32_t second, std::size_t second_bytes);
void check_checksum(const std::string& path, const char* what, uint32_t actual, uint32_t recorded);

// ---------------------------------------------------------------------------------
// Writing (io/checkpoint_writer.cpp).

// Tamper and save_tampered_impl: io/checkpoint_tamper.h.

// ---------------------------------------------------------------------------------
// Reading (io/checkpoint_reader.cpp).

// load_checkpoint_from_bytes: io/checkpoint_reader.h.

}  // namespace checkpoint_internal
}  // namespace engine
