// The checkpoint file layer. docs/checkpoint-format.md is the specification; this file
// implements it on the HDF5 C library plus zlib's crc32.
#include "engine/checkpoint.h"

#include "io/checkpoint_assemble.h"
#include "io/crc32.h"
#include "io/hdf5_sandbox.h"
#include "io/deferred_remove.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <new>
#include <optional>
#include <utility>
#include <vector>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#ifndef ENGINE_VERSION
#define ENGINE_VERSION "0.0.0-dev"  // standalone builds; CMake defines the real one
#endif

// float16 tensors hold raw IEEE half bits in host order and are written as little-endian
// halves without conversion.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint layer assumes a little-endian host");

namespace engine {

namespace {

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

const char* const kRootAttributes[] = {"format",      "format_version", "engine_version",
                                       "created_utc", "saved_on",       "config"};

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw CheckpointError(path + ": " + msg);
}

std::string corrupt(const std::string& detail) {
  return "checksum mismatch (file is corrupt): " + detail;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Shortest text that reads back as the same double.
std::string fmt_double(double v) {
  char buf[40];
  for (int prec = 15; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) break;
  }
  return buf;
}

std::string fmt_short(double v) {
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
void side_by_side(const std::function<void()>& first, const std::function<void()>& second) {
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

herr_t take_innermost_error(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err && err->desc) {
    try {
      *static_cast<std::string*>(out) = err->desc;
    } catch (...) {
    }
  }
  return 0;
}

std::string hdf5_reason() {
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

  [[noreturn]] void fail(const std::string& msg) const { engine::fail(path, msg); }
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

// IEEE binary16 as HDF5 fields (sign bit 15, exponent bits 10..14, mantissa 0..9,
// bias 15); HDF5 1.10 has no predefined half type. h5py builds the same type.
H5Handle half_type(const H5Ctx& c, bool big_endian) {
  H5Handle t = c.copy_type(big_endian ? H5T_IEEE_F32BE : H5T_IEEE_F32LE);
  c.ok(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "cannot define the float16 type");
  c.ok(H5Tset_size(t.get(), 2), "cannot define the float16 type");
  c.ok(H5Tset_ebias(t.get(), 15), "cannot define the float16 type");
  return t;
}

H5Handle utf8_string_type(const H5Ctx& c) {
  H5Handle t = c.copy_type(H5T_C_S1);
  c.ok(H5Tset_size(t.get(), H5T_VARIABLE), "cannot define the string type");
  c.ok(H5Tset_cset(t.get(), H5T_CSET_UTF8), "cannot define the string type");
  return t;
}

// File and memory datatypes of a tensor dtype.
H5Handle file_type_of(const H5Ctx& c, DType d) {
  switch (d) {
    case DType::F32: return c.copy_type(H5T_IEEE_F32LE);
    case DType::F16: return half_type(c, false);
    case DType::I32: return c.copy_type(H5T_STD_I32LE);
    case DType::U8: return c.copy_type(H5T_STD_U8LE);
  }
  c.fail("unknown tensor dtype");
}

H5Handle memory_type_of(const H5Ctx& c, DType d) {
  switch (d) {
    case DType::F32: return c.copy_type(H5T_NATIVE_FLOAT);
    case DType::F16: return half_type(c, false);
    case DType::I32: return c.copy_type(H5T_NATIVE_INT32);
    case DType::U8: return c.copy_type(H5T_NATIVE_UINT8);
  }
  c.fail("unknown tensor dtype");
}

bool type_equals(hid_t a, hid_t b) { return H5Tequal(a, b) > 0; }

std::string describe_type(hid_t t) {
  const std::size_t bits = H5Tget_size(t) * 8;
  switch (H5Tget_class(t)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: return "float" + std::to_string(bits);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_REFERENCE: return "reference";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    default: return "unknown";
  }
}

// ---------------------------------------------------------------------------------
// Keys.

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = key.find('/', start);
    parts.push_back(key.substr(start, slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

void check_name(const std::string& path, const std::string& what, const std::string& key) {
  for (const std::string& part : split_key(key)) {
    if (part.empty() || part == "." || part.find('\0') != std::string::npos)
      fail(path, what + " '" + key + "' is not a valid key (empty, '.' or NUL in a '/'-separated part)");
  }
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// Renames keys of one group; two keys becoming one is an error rather than a silent loss.
template <class V>
std::map<std::string, V> rename_keys(const std::string& path, const std::string& group,
                                     const std::map<std::string, V>& in,
                                     std::string (*rename)(const std::string&)) {
  std::map<std::string, V> out;
  std::map<std::string, std::string> origin;
  for (const auto& [key, value] : in) {
    const std::string name = rename(key);
    auto [it, fresh] = origin.emplace(name, key);
    if (!fresh)
      fail(path, group + " keys '" + it->second + "' and '" + key + "' both become '" + name +
                     "' once wrapper prefixes are stripped");
    out.emplace(name, value);
  }
  return out;
}

std::string normalise_optimizer_key(const std::string& key) {
  const std::size_t slash = key.rfind('/');
  if (slash == std::string::npos) return key;  // hyperparameters: "lr", "name"
  return key.substr(0, slash + 1) + strip_wrapper_prefixes(key.substr(slash + 1));
}

void normalise_keys(const std::string& path, std::map<std::string, StateDict>& groups) {
  if (auto it = groups.find("model"); it != groups.end()) {
    it->second.tensors = rename_keys(path, "model", it->second.tensors, strip_wrapper_prefixes);
    it->second.scalars = rename_keys(path, "model", it->second.scalars, strip_wrapper_prefixes);
  }
  if (auto it = groups.find("optimizer"); it != groups.end()) {
    it->second.tensors = rename_keys(path, "optimizer", it->second.tensors, normalise_optimizer_key);
    it->second.scalars = rename_keys(path, "optimizer", it->second.scalars, normalise_optimizer_key);
  }
}

bool is_series(const Scalar& s) { return std::holds_alternative<std::vector<double>>(s); }

// A key names either a dataset (tensor, series) or an attribute; its '/'-prefixes name
// groups. A dataset key that is also a group prefix cannot be stored.
void check_group_keys(const std::string& path, const std::string& group, const StateDict& d) {
  std::set<std::string> datasets, prefixes;
  auto add = [&](const std::string& key, bool dataset) {
    check_name(path, group + " key", key);
    if (dataset) datasets.insert(key);
    for (std::size_t slash = key.find('/'); slash != std::string::npos; slash = key.find('/', slash + 1))
      prefixes.insert(key.substr(0, slash));
  };
  for (const auto& [key, t] : d.tensors) {
    add(key, true);
    if (d.scalars.count(key)) fail(path, group + " key '" + key + "' is both a tensor and a scalar");
  }
  for (const auto& [key, s] : d.scalars) add(key, is_series(s));
  for (const std::string& key : datasets)
    if (prefixes.count(key))
      fail(path, group + " key '" + key + "' is a dataset and also the group of other keys ('" + key + "/...')");
}

void check_no_nul(const std::string& path, const std::string& what, const std::string& text) {
  if (text.find('\0') != std::string::npos) fail(path, what + " contains a NUL character");
}

void check_for_save(const std::string& path, const Checkpoint& ckpt, bool require_groups) {
  if (ckpt.meta.saved_on.empty()) fail(path, "meta.saved_on is empty; set it to the training device (\"cpu\", \"cuda:0\")");
  check_no_nul(path, "meta.saved_on", ckpt.meta.saved_on);
  check_no_nul(path, "config_json", ckpt.config_json);
  if (require_groups)
    for (const std::string& g : checkpoint_required_groups())
      if (!ckpt.groups.count(g)) fail(path, "checkpoint has no '" + g + "' group");
  for (const auto& [group, d] : ckpt.groups) {
    if (group.empty() || group == "." || group.find_first_of(std::string("/\0", 2)) != std::string::npos)
      fail(path, "group name '" + group + "' is not valid");
    check_group_keys(path, group, d);
    for (const auto& [key, t] : d.tensors) {
      const std::string where = group + "/" + key;
      if (!t.defined()) fail(path, "tensor " + where + " is undefined");
      if (t.rank() > kMaxRank) fail(path, "tensor " + where + " has rank " + std::to_string(t.rank()) + " (at most 8)");
      if (static_cast<uint64_t>(t.numel()) > kMaxElements)
        fail(path, "tensor " + where + " has more than 2^31 elements");
    }
    for (const auto& [key, s] : d.scalars) {
      if (auto text = std::get_if<std::string>(&s)) check_no_nul(path, "scalar " + group + "/" + key, *text);
      if (auto series = std::get_if<std::vector<double>>(&s))
        if (series->size() > kMaxElements) fail(path, "series " + group + "/" + key + " is too long");
    }
  }
}

// ---------------------------------------------------------------------------------
// Writing the HDF5 image.

std::string unique_image_name(const char* role) {
  // The core driver never touches this name on disk; it only has to be unique among
  // the files HDF5 has open in this process.
  static std::atomic<unsigned long> counter{0};
  return std::string("engine-checkpoint-") + role + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

class ImageWriter {
 public:
  explicit ImageWriter(const H5Ctx& c) : c_(c) {
    scalar_space_ = c_.own(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace");
    string_type_ = utf8_string_type(c_);
    // No modification times: the same state gives the same bytes.
    gcpl_ = c_.plist(H5P_GROUP_CREATE, "a group property list");
    c_.ok(H5Pset_obj_track_times(gcpl_.get(), 0), "cannot configure groups");
    dcpl_ = c_.plist(H5P_DATASET_CREATE, "a dataset property list");
    c_.ok(H5Pset_obj_track_times(dcpl_.get(), 0), "cannot configure datasets");
  }

  H5Handle create_group(hid_t parent, const std::string& name, const std::string& where) {
    return c_.own(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl_.get(), H5P_DEFAULT), H5Gclose,
                  "cannot create group " + where);
  }

  // The group holding `key` below the group `g` (created on first use and kept open in
  // `open_groups` for the keys that follow); sets `leaf` to the last part of the key.
  hid_t parent_of(hid_t g, const std::string& where, const std::string& key, std::string& leaf,
                  std::map<std::string, H5Handle>& open_groups) {
    const std::size_t slash = key.rfind('/');
    leaf = slash == std::string::npos ? key : key.substr(slash + 1);
    if (slash == std::string::npos) return g;
    const std::string dir = key.substr(0, slash);
    if (auto it = open_groups.find(dir); it != open_groups.end()) return it->second.get();
    std::string rest;
    const hid_t above = parent_of(g, where, dir, rest, open_groups);
    const std::string at = where + "/" + dir;
    const htri_t exists = H5Lexists(above, rest.c_str(), H5P_DEFAULT);
    c_.ok(exists, "cannot look up " + at);
    H5Handle opened = exists > 0 ? c_.own(H5Gopen2(above, rest.c_str(), H5P_DEFAULT), H5Gclose, "cannot open group " + at)
                                 : create_group(above, rest, at);
    return open_groups.emplace(dir, std::move(opened)).first->second.get();
  }

  void write_attribute(hid_t obj, const std::string& name, const Scalar& s, const std::string& where) {
    hid_t ftype = -1, mtype = -1;
    const void* data = nullptr;
    const char* text = nullptr;
    if (auto i = std::get_if<int64_t>(&s)) {
      ftype = H5T_STD_I64LE;
      mtype = H5T_NATIVE_INT64;
      data = i;
    } else if (auto d = std::get_if<double>(&s)) {
      ftype = H5T_IEEE_F64LE;
      mtype = H5T_NATIVE_DOUBLE;
      data = d;
    } else if (auto str = std::get_if<std::string>(&s)) {
      text = str->c_str();
      ftype = mtype = string_type_.get();
      data = &text;
    } else {
      c_.fail("series " + where + " cannot be an attribute");
    }
    H5Handle attr = c_.own(H5Acreate2(obj, name.c_str(), ftype, scalar_space_.get(), H5P_DEFAULT, H5P_DEFAULT),
                           H5Aclose, "cannot create attribute " + where);
    c_.ok(H5Awrite(attr.get(), mtype, data), "cannot write attribute " + where);
  }

  // Creates a dataset and queues its data for write_pending_data(): the data of every
  // dataset is written after all the metadata exists, so that HDF5 allocates it after the
  // metadata and the file ends with a region of dataset bytes only (see metadata_bytes).
  hid_t create_dataset(hid_t parent, const std::string& name, hid_t ftype, const Shape& shape, const void* data,
                       const Tensor& keep_alive, std::optional<DType> tensor_dtype, const std::string& where) {
    H5Handle space;
    if (shape.empty()) {
      space = c_.own(H5Screate(H5S_SCALAR), H5Sclose, "cannot create the dataspace of " + where);
    } else {
      const std::vector<hsize_t> dims(shape.begin(), shape.end());
      space = c_.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                     "cannot create the dataspace of " + where);
    }
    H5Handle dset = c_.own(H5Dcreate2(parent, name.c_str(), ftype, space.get(), H5P_DEFAULT, dcpl_.get(), H5P_DEFAULT),
                           H5Dclose, "cannot create dataset " + where);
    const hid_t id = dset.get();
    if (shape_numel(shape) > 0) pending_.push_back(PendingData{std::move(dset), keep_alive, data, tensor_dtype, where});
    else finished_.push_back(std::move(dset));
    return id;
  }

  // Writes the queued data; returns where each dataset's bytes went (file offsets).
  std::vector<std::pair<uint64_t, uint64_t>> write_pending_data() {
    std::vector<std::pair<uint64_t, uint64_t>> extents;
    for (PendingData& p : pending_) {
      H5Handle mtype = p.tensor_dtype ? memory_type_of(c_, *p.tensor_dtype) : c_.copy_type(H5T_NATIVE_DOUBLE);
      c_.ok(H5Dwrite(p.dset.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data),
            "cannot write dataset " + p.where);
      const haddr_t offset = H5Dget_offset(p.dset.get());
      if (offset != HADDR_UNDEF) extents.emplace_back(offset, H5Dget_storage_size(p.dset.get()));
    }
    pending_.clear();
    finished_.clear();
    return extents;
  }

  void write_group(hid_t root, const std::string& group, const StateDict& d) {
    const std::string gpath = "/" + group;
    H5Handle g = create_group(root, group, gpath);
    std::map<std::string, H5Handle> open_groups;
    for (const auto& [key, s] : d.scalars) {
      std::string leaf;
      const hid_t parent = parent_of(g.get(), gpath, key, leaf, open_groups);
      const std::string where = gpath + "/" + key;
      if (auto series = std::get_if<std::vector<double>>(&s)) {
        const hid_t dset = create_dataset(parent, leaf, H5T_IEEE_F64LE, {static_cast<int64_t>(series->size())},
                                          series->data(), Tensor(), std::nullopt, where);
        write_attribute(dset, "kind", std::string("series"), where + "@kind");
      } else {
        write_attribute(parent, leaf, s, where);
      }
    }
    for (const auto& [key, tensor] : d.tensors) {
      std::string leaf;
      const hid_t parent = parent_of(g.get(), gpath, key, leaf, open_groups);
      const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
      H5Handle ftype = file_type_of(c_, host.dtype());
      create_dataset(parent, leaf, ftype.get(), host.shape(), host.raw(), host, host.dtype(), gpath + "/" + key);
    }
  }

  void write_raw(hid_t root, const checkpoint_testing::RawDataset& raw) {
    const std::size_t slash = raw.path.rfind('/');
    H5Handle parent = c_.own(H5Gopen2(root, slash == 0 ? "/" : raw.path.substr(0, slash).c_str(), H5P_DEFAULT),
                             H5Gclose, "cannot open the parent of " + raw.path);
    H5Handle ftype;
    if (raw.type == "float32") ftype = c_.copy_type(H5T_IEEE_F32LE);
    else if (raw.type == "float64") ftype = c_.copy_type(H5T_IEEE_F64LE);
    else if (raw.type == "int64") ftype = c_.copy_type(H5T_STD_I64LE);
    else if (raw.type == "int16") ftype = c_.copy_type(H5T_STD_I16LE);
    else if (raw.type == "uint8") ftype = c_.copy_type(H5T_STD_U8LE);
    else if (raw.type == "string") ftype = utf8_string_type(c_);
    else c_.fail("unknown raw dataset type " + raw.type);
    const std::vector<hsize_t> dims(raw.dims.begin(), raw.dims.end());
    H5Handle space;
    if (dims.empty())
      space = c_.own(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace");
    else
      space = c_.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                     "cannot create the dataspace of " + raw.path);
    // Chunked and never written: HDF5 allocates nothing, so any shape costs nothing.
    // External: contiguous, with its (unwritten) data in another file.
    H5Handle dcpl = c_.plist(H5P_DATASET_CREATE, "a dataset property list");
    const bool has_zero = std::find(dims.begin(), dims.end(), 0) != dims.end();
    if (!raw.external_file.empty()) {
      c_.ok(H5Pset_external(dcpl.get(), raw.external_file.c_str(), 0, H5F_UNLIMITED), "cannot set external storage");
    } else if (!dims.empty() && !has_zero) {
      const std::vector<hsize_t> chunk(dims.size(), 1);
      c_.ok(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "cannot set chunking");
    }
    H5Handle dset = c_.own(H5Dcreate2(parent.get(), raw.path.substr(slash + 1).c_str(), ftype.get(), space.get(),
                                      H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                           H5Dclose, "cannot create dataset " + raw.path);
    if (raw.series_kind) write_attribute(dset.get(), "kind", std::string("series"), raw.path + "@kind");
  }

 private:
  struct PendingData {
    H5Handle dset;
    Tensor keep_alive;  // a host copy of a device tensor lives until its data is written
    const void* data;
    std::optional<DType> tensor_dtype;  // nullopt: a float64 series
    std::string where;
  };
  const H5Ctx& c_;
  H5Handle scalar_space_, string_type_, gcpl_, dcpl_;
  std::vector<PendingData> pending_;
  std::vector<H5Handle> finished_;
};

// The in-memory HDF5 file of a save grows inside a Bytes that this file owns, through
// the core driver's file-image callbacks, and is taken over at close: no copy of the
// image with H5Fget_file_image, and no second buffer to fault in.
// File-image udata is our own object, shared rather than copied by HDF5; HDF5 asks to
// copy the image onto itself when the buffer is ours, which costs nothing.
void* image_udata_share(void* udata) { return udata; }
herr_t image_udata_keep(void*) { return 0; }
void* image_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t, void*) {
  if (dest != src) std::memcpy(dest, src, size);
  return dest;
}

struct GrowingImage {
  Bytes bytes;
  bool failed = false;
};

// The buffer of the last save, kept for the next one: a training run saves the same
// state size again and again, and faulting in fresh pages for every save costs more than
// building the file. One buffer per process, the size of the largest checkpoint saved.
class SpareImage {
 public:
  static Bytes take() {
    std::lock_guard<std::mutex> lock(mutex());
    return std::move(slot());
  }
  static void give_back(Bytes bytes) {
    std::lock_guard<std::mutex> lock(mutex());
    if (bytes.capacity() >= slot().capacity()) slot() = std::move(bytes);
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static Bytes& slot() {
    static Bytes b;
    return b;
  }
};
void* growing_realloc(void* ptr, std::size_t size, H5FD_file_image_op_t, void* udata) {
  auto* img = static_cast<GrowingImage*>(udata);
  if (ptr != nullptr && ptr != img->bytes.data()) return nullptr;  // never ours to move
  try {
    img->bytes.resize(size);  // keeps the content, like realloc
  } catch (const std::bad_alloc&) {
    img->failed = true;
    return nullptr;
  }
  return img->bytes.data();
}
void* growing_malloc(std::size_t size, H5FD_file_image_op_t op, void* udata) {
  return growing_realloc(nullptr, size, op, udata);
}
herr_t growing_free(void*, H5FD_file_image_op_t, void*) { return 0; }  // the Bytes keeps it

// Bytes the file will take: tensors and series plus their alignment, and room for the
// metadata, so the core driver allocates once.
std::size_t estimated_file_bytes(const Checkpoint& ckpt) {
  std::size_t total = kUserBlockBytes + (std::size_t(256) << 10) + ckpt.config_json.size();
  for (const auto& [group, d] : ckpt.groups) {
    for (const auto& [key, t] : d.tensors) total += t.nbytes() + kDataAlignment + 512;
    for (const auto& [key, s] : d.scalars)
      total += 512 + (std::holds_alternative<std::vector<double>>(s) ? std::get<std::vector<double>>(s).size() * 8 : 0);
  }
  constexpr std::size_t kStep = std::size_t(64) << 10;
  return (total + kStep - 1) / kStep * kStep;
}

// A built file: the image (user block still blank) and how many bytes after the user
// block hold all of the HDF5 metadata (the rest holds only dataset bytes and zeros).
struct BuiltImage {
  Bytes bytes;
  std::size_t metadata_bytes = 0;
};

// Whether [metadata_end, end) of `image` holds nothing but the given dataset extents
// and zero bytes: then no HDF5 metadata lies past metadata_end.
bool only_data_after(const Bytes& image, std::size_t metadata_end, std::vector<std::pair<uint64_t, uint64_t>> extents) {
  std::sort(extents.begin(), extents.end());
  std::size_t pos = metadata_end;
  auto zeros = [&](std::size_t from, std::size_t to) {
    return std::all_of(image.data() + from, image.data() + to, [](unsigned char b) { return b == 0; });
  };
  for (const auto& [offset, bytes] : extents) {
    if (offset < metadata_end || offset > image.size() || bytes > image.size() - offset) return false;
    if (offset > pos && !zeros(pos, offset)) return false;
    pos = std::max<std::size_t>(pos, offset + bytes);
  }
  return zeros(pos, image.size());
}

BuiltImage build_image(const H5Ctx& c, const Checkpoint& ckpt, const checkpoint_testing::Tamper& tamper) {
  H5Handle fcpl = c.plist(H5P_FILE_CREATE, "a file property list");
  if (!tamper.plain_hdf5) c.ok(H5Pset_userblock(fcpl.get(), kUserBlockBytes), "cannot reserve the user block");
  H5Handle fapl = c.plist(H5P_FILE_ACCESS, "a file access property list");
  c.ok(H5Pset_fapl_core(fapl.get(), estimated_file_bytes(ckpt), 0), "cannot select the in-memory driver");
  c.ok(H5Pset_alignment(fapl.get(), kAlignThreshold, kDataAlignment), "cannot set the data alignment");
  GrowingImage image;
  image.bytes = SpareImage::take();
  image.bytes.resize(0);
  H5FD_file_image_callbacks_t callbacks = {growing_malloc,    image_memcpy,      growing_realloc, growing_free,
                                           image_udata_share, image_udata_keep, &image};
  c.ok(H5Pset_file_image_callbacks(fapl.get(), &callbacks), "cannot set the file image callbacks");
  H5Handle file = c.own(H5Fcreate(unique_image_name("save").c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                        H5Fclose, "cannot create the in-memory HDF5 file");
  ssize_t hdf5_bytes = 0, metadata_hdf5_bytes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  {
    ImageWriter w(c);
    H5Handle root = c.own(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose, "cannot open the root group");
    const std::map<std::string, Scalar> attrs = {
        {"format", std::string(kFormatName)},
        {"format_version", tamper.format_version},
        {"engine_version", std::string(ENGINE_VERSION)},
        {"created_utc", utc_now()},
        {"saved_on", ckpt.meta.saved_on},
        {"config", ckpt.config_json},
    };
    auto omitted = [](const std::vector<std::string>& list, const std::string& name) {
      return std::find(list.begin(), list.end(), name) != list.end();
    };
    for (const char* name : kRootAttributes)
      if (!omitted(tamper.omit_root_attributes, name)) w.write_attribute(root.get(), name, attrs.at(name), std::string("/@") + name);
    for (const auto& [group, d] : ckpt.groups)
      if (!omitted(tamper.omit_groups, group)) w.write_group(root.get(), group, d);
    for (const auto& raw : tamper.raw_datasets) w.write_raw(root.get(), raw);

    // Everything but the dataset bytes exists now; where the file ends is where the
    // data will begin.
    c.ok(H5Fflush(file.get(), H5F_SCOPE_LOCAL), "cannot flush the in-memory HDF5 file");
    metadata_hdf5_bytes = H5Fget_file_image(file.get(), nullptr, 0);
    if (metadata_hdf5_bytes <= 0) c.fail("cannot get the HDF5 file image size" + hdf5_reason());
    extents = w.write_pending_data();
    c.ok(H5Fflush(file.get(), H5F_SCOPE_LOCAL), "cannot flush the in-memory HDF5 file");
    // The size of the HDF5 part (from the superblock on; the driver's memory also holds
    // the user block in front of it, zero-filled).
    hdf5_bytes = H5Fget_file_image(file.get(), nullptr, 0);
    if (hdf5_bytes <= 0) c.fail("cannot get the HDF5 file image size" + hdf5_reason());
  }
  if (H5Fclose(file.get()) < 0) {
    (void)file.release();
    c.fail("cannot close the in-memory HDF5 file" + hdf5_reason());
  }
  (void)file.release();
  if (image.failed) throw std::bad_alloc();
  const std::size_t userblock = tamper.plain_hdf5 ? 0 : kUserBlockBytes;
  const std::size_t total = userblock + static_cast<std::size_t>(hdf5_bytes);
  if (image.bytes.size() < total) c.fail("the in-memory HDF5 file is shorter than its image");
  image.bytes.resize(total);
  BuiltImage built;
  // Checked, not assumed: if HDF5 put any metadata among the data, all of the payload
  // counts as metadata (always correct, only slower to load).
  const std::size_t metadata_end = userblock + static_cast<std::size_t>(metadata_hdf5_bytes);
  built.metadata_bytes =
      only_data_after(image.bytes, metadata_end, std::move(extents)) ? metadata_end - userblock : total - userblock;
  built.bytes = std::move(image.bytes);
  return built;
}

// ---------------------------------------------------------------------------------
// The integrity header in the user block (layout in docs/checkpoint-format.md).

// The checksums a header records: of the first metadata_bytes of the payload, and of all
// of it.
struct PayloadChecksums {
  std::size_t metadata_bytes = 0;
  uint32_t metadata_crc = 0, payload_crc = 0;
};

PayloadChecksums checksums_of(const unsigned char* payload, std::size_t payload_bytes, std::size_t metadata_bytes) {
  PayloadChecksums sums;
  sums.metadata_bytes = metadata_bytes;
  sums.metadata_crc = crc32_update(0, payload, metadata_bytes);
  const uint32_t data_crc = crc32_update(0, payload + metadata_bytes, payload_bytes - metadata_bytes);
  sums.payload_crc = static_cast<uint32_t>(
      crc32_combine(sums.metadata_crc, data_crc, static_cast<z_off_t>(payload_bytes - metadata_bytes)));
  return sums;
}

// Fills the user block of `image` (layout in docs/checkpoint-format.md, section 1.1).
// Version 1 headers have no metadata lines; tests write them to stand for old files.
void seal_with(Bytes& image, int64_t format_version, const PayloadChecksums& sums) {
  const std::size_t payload = image.size() - kUserBlockBytes;
  std::string text = kMagic;
  text += "format_version " + std::to_string(format_version) + "\n";
  text += "userblock_bytes " + std::to_string(kUserBlockBytes) + "\n";
  text += "payload_bytes " + std::to_string(payload) + "\n";
  if (format_version >= 2) {
    text += "metadata_bytes " + std::to_string(sums.metadata_bytes) + "\n";
    text += "metadata_crc32 " + hex32(sums.metadata_crc) + "\n";
  }
  text += "payload_crc32 " + hex32(sums.payload_crc) + "\n";
  text += "header_crc32 " + hex32(crc32_update(0, reinterpret_cast<const unsigned char*>(text.data()), text.size())) + "\n";
  std::fill(image.begin(), image.begin() + kUserBlockBytes, 0);
  std::copy(text.begin(), text.end(), image.begin());
}

// Seals with all of the payload counted as metadata: right for any file.
void seal(Bytes& image, int64_t format_version) {
  const std::size_t payload = image.size() - kUserBlockBytes;
  seal_with(image, format_version, checksums_of(image.data() + kUserBlockBytes, payload, payload));
}

struct Header {
  int64_t format_version = 0;
  std::size_t payload_bytes = 0, metadata_bytes = 0;  // version 1: all of the payload is metadata
  uint32_t payload_crc = 0, metadata_crc = 0;
};

bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoull(s);
  return true;
}

bool parse_hex32(const std::string& s, uint32_t& out) {
  if (s.size() != 8 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  out = static_cast<uint32_t>(std::stoul(s, nullptr, 16));
  return true;
}

int bit_distance(const unsigned char* a, const char* b, std::size_t n) {
  int bits = 0;
  for (std::size_t i = 0; i < n; ++i) bits += __builtin_popcount(static_cast<unsigned>(a[i] ^ static_cast<unsigned char>(b[i])));
  return bits;
}

// Everything about the header before any payload byte is trusted: magic, header
// checksum, version, fields, length, in that order so each refusal names the real
// problem. `file` holds the first min(size, 512) bytes of a file of `size` bytes; the
// payload checksums are checked by the caller as the payload is read.
Header parse_header(const std::string& path, const unsigned char* file, std::size_t size) {
  if (size == 0) fail(path, "truncated: the file is empty");
  if (std::memcmp(file, kMagic, std::min(size, kMagicBytes)) != 0) {
    if (size >= 8 && std::memcmp(file, kHdf5Signature, 8) == 0)
      fail(path, "not an engine checkpoint: a plain HDF5 file without the engine header");
    // One or two flipped bits in the magic are damage, not a foreign file.
    if (size >= kMagicBytes && bit_distance(file, kMagic, kMagicBytes) <= 2)
      fail(path, corrupt("damaged magic at the start of the file"));
    fail(path, "not an engine checkpoint (wrong magic; expected a file written by save_checkpoint)");
  }
  if (size < kUserBlockBytes)
    fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(kUserBlockBytes) + "-byte header");

  const unsigned char* block = file;
  const std::size_t text_end = std::find(block, block + kUserBlockBytes, 0) - block;
  for (std::size_t i = text_end; i < kUserBlockBytes; ++i)
    if (block[i] != 0) fail(path, corrupt("non-zero byte at offset " + std::to_string(i) + " of the header padding"));
  const std::string text(reinterpret_cast<const char*>(block), text_end);
  if (text.empty() || text.back() != '\n') fail(path, corrupt("header text is not terminated"));
  const std::size_t last = text.rfind('\n', text.size() - 2) + 1;
  const std::string crc_line = text.substr(last, text.size() - 1 - last);
  uint32_t header_crc = 0;
  if (crc_line.compare(0, 13, "header_crc32 ") != 0 || !parse_hex32(crc_line.substr(13), header_crc))
    fail(path, corrupt("header has no valid header_crc32 line"));
  const uint32_t actual_header_crc = crc32_update(0, block, last);
  if (actual_header_crc != header_crc)
    fail(path, corrupt("header crc32 is " + hex32(actual_header_crc) + ", recorded " + hex32(header_crc)));

  std::map<std::string, std::string> fields;
  std::istringstream lines(text.substr(kMagicBytes, last - kMagicBytes));
  for (std::string line; std::getline(lines, line);) {
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || !fields.emplace(line.substr(0, space), line.substr(space + 1)).second)
      fail(path, corrupt("malformed header line '" + line + "'"));
  }
  uint64_t version = 0;
  if (!fields.count("format_version") || !parse_u64(fields["format_version"], version))
    fail(path, corrupt("header has no valid format_version"));
  if (version > static_cast<uint64_t>(kCheckpointFormatVersion))
    fail(path, "format_version " + std::to_string(version) + " is newer than this engine supports (" +
                   std::to_string(kCheckpointFormatVersion) + "); upgrade the engine");
  if (version < 1) fail(path, "format_version " + std::to_string(version) + " is not a valid version");

  uint64_t userblock = 0, payload = 0;
  uint32_t payload_crc = 0;
  if (!fields.count("userblock_bytes") || !parse_u64(fields["userblock_bytes"], userblock) ||
      userblock != kUserBlockBytes || !fields.count("payload_bytes") || !parse_u64(fields["payload_bytes"], payload) ||
      !fields.count("payload_crc32") || !parse_hex32(fields["payload_crc32"], payload_crc))
    fail(path, corrupt("header lacks userblock_bytes, payload_bytes or payload_crc32"));
  const uint64_t expected = kUserBlockBytes + payload;
  if (size < expected)
    fail(path, "truncated: " + std::to_string(size) + " bytes, the header records " + std::to_string(expected));
  if (size > expected)
    fail(path, "length mismatch (file is corrupt): " + std::to_string(size) + " bytes, the header records " +
                   std::to_string(expected));
  Header h;
  h.format_version = static_cast<int64_t>(version);
  h.payload_bytes = static_cast<std::size_t>(payload);
  h.payload_crc = payload_crc;
  h.metadata_bytes = h.payload_bytes;
  h.metadata_crc = payload_crc;
  if (version >= 2) {
    uint64_t metadata = 0;
    if (!fields.count("metadata_bytes") || !parse_u64(fields["metadata_bytes"], metadata) || metadata > payload ||
        !fields.count("metadata_crc32") || !parse_hex32(fields["metadata_crc32"], h.metadata_crc))
      fail(path, corrupt("header lacks a valid metadata_bytes or metadata_crc32"));
    h.metadata_bytes = static_cast<std::size_t>(metadata);
  }
  return h;
}

// ---------------------------------------------------------------------------------
// Reading.

// Reads [begin, end) of `fd` into data + begin, in pieces small enough to stay in cache
// while their checksum is taken; pieces before `split` go to crc_before, the rest to
// crc_after. Returns the offset reached (short of `end` at end of file); `err` is set to
// the errno of a failed read.
std::size_t read_range_with_crc(int fd, unsigned char* data, std::size_t begin, std::size_t end, std::size_t split,
                                uint32_t& crc_before, uint32_t& crc_after, int& err) {
  constexpr std::size_t kPiece = std::size_t(256) << 10;
  std::size_t pos = begin;
  crc_before = crc_after = 0;
  while (pos < end) {
    const std::size_t limit = pos < split ? std::min(end, split) : end;
    const ssize_t n = ::pread(fd, data + pos, std::min(limit - pos, kPiece), static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    uint32_t& crc = pos < split ? crc_before : crc_after;
    crc = crc32_update(crc, data + pos, static_cast<std::size_t>(n));
    pos += static_cast<std::size_t>(n);
  }
  return pos;
}

// An open checkpoint file being read into one buffer; every refusal names the file.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (fstat(fd_, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
    size_ = static_cast<std::size_t>(st.st_size);
  }
  ~FileReader() { ::close(fd_); }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  std::size_t size() const { return size_; }
  const std::shared_ptr<Bytes>& bytes() const { return bytes_; }

  // The first min(size, 512) bytes, read into `header` before any buffer exists, so that
  // a file that is not a checkpoint (of any size) is refused without allocating it.
  std::size_t read_header(unsigned char (&header)[kUserBlockBytes]) {
    const std::size_t want = std::min(size_, kUserBlockBytes);
    std::size_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd_, header + got, want - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_, std::string("cannot read: ") + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    check_read(got, want, 0);
    return got;
  }

  // The buffer for the whole file, starting with the header bytes already read.
  void allocate(const unsigned char* header, std::size_t header_bytes) {
    bytes_ = std::make_shared<Bytes>(size_);
    std::memcpy(bytes_->data(), header, header_bytes);
  }

  // Reads [begin, end), checksummed as two parts split at `split`; fails if the file
  // ends early.
  void read(std::size_t begin, std::size_t end, std::size_t split, uint32_t& crc_before, uint32_t& crc_after) {
    int err = 0;
    const std::size_t reached = read_range_with_crc(fd_, bytes_->data(), begin, end, split, crc_before, crc_after, err);
    check_read(reached, end, err);
  }

  // Reads [begin, end) with two threads, one half each, and returns the checksum of it.
  uint32_t read_in_halves(std::size_t begin, std::size_t end) {
    const std::size_t mid = std::max(begin, (begin + (end - begin) / 2) / 4096 * 4096);
    uint32_t crcs[2][2] = {{0, 0}, {0, 0}};
    std::size_t reached[2] = {0, 0};
    int errs[2] = {0, 0};
    auto read_half = [&](int half) {
      reached[half] = read_range_with_crc(fd_, bytes_->data(), half == 0 ? begin : mid, half == 0 ? mid : end, end,
                                          crcs[half][0], crcs[half][1], errs[half]);
    };
    side_by_side([&] { read_half(0); }, [&] { read_half(1); });
    check_read(reached[0], mid, errs[0]);
    check_read(reached[1], end, errs[1]);
    return static_cast<uint32_t>(crc32_combine(crcs[0][0], crcs[1][0], static_cast<z_off_t>(end - mid)));
  }

  // A file that grew since it was measured is not the file whose header was checked.
  void check_not_grown() {
    unsigned char probe = 0;
    ssize_t n;
    do n = ::pread(fd_, &probe, 1, static_cast<off_t>(size_));
    while (n < 0 && errno == EINTR);
    if (n > 0) fail(path_, "length mismatch: the file grew while it was being read");
  }

 private:
  void check_read(std::size_t reached, std::size_t end, int err) {
    if (err != 0) fail(path_, std::string("cannot read: ") + std::strerror(err));
    if (reached < end)
      fail(path_, "truncated: the file shrank to " + std::to_string(reached) + " bytes while it was being read");
  }

  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
  std::shared_ptr<Bytes> bytes_;
};

uint32_t crc_join(uint32_t first, uint32_t second, std::size_t second_bytes) {
  return static_cast<uint32_t>(crc32_combine(first, second, static_cast<z_off_t>(second_bytes)));
}

void check_checksum(const std::string& path, const char* what, uint32_t actual, uint32_t recorded) {
  if (actual != recorded)
    fail(path, corrupt(std::string("crc32 of the HDF5 ") + what + " is " + hex32(actual) + ", recorded " + hex32(recorded)));
}

// HDF5 file-image callbacks that lend HDF5 the caller's buffer instead of copying it
// (read-only opens never write, reallocate or free it). The buffer must outlive the file.
struct LentImage {
  void* data;
  std::size_t size;
};
void* lent_malloc(std::size_t size, H5FD_file_image_op_t, void* udata) {
  auto* img = static_cast<LentImage*>(udata);
  return size == img->size ? img->data : nullptr;
}
void* lent_realloc(void*, std::size_t, H5FD_file_image_op_t, void*) { return nullptr; }
herr_t lent_free(void*, H5FD_file_image_op_t, void*) { return 0; }

// Opens verified bytes as an HDF5 file in memory, so the disk is read once and the
// bytes are not copied again.
H5Handle open_image(const H5Ctx& c, Bytes& bytes, LentImage& lent) {
  H5Handle fapl = c.plist(H5P_FILE_ACCESS, "a file access property list");
  c.ok(H5Pset_fapl_core(fapl.get(), kCoreIncrement, 0), "cannot select the in-memory driver");
  lent = LentImage{bytes.data(), bytes.size()};
  H5FD_file_image_callbacks_t callbacks = {lent_malloc,       image_memcpy,      lent_realloc,    lent_free,
                                           image_udata_share, image_udata_keep, &lent};
  c.ok(H5Pset_file_image_callbacks(fapl.get(), &callbacks), "cannot set the file image callbacks");
  c.ok(H5Pset_file_image(fapl.get(), bytes.data(), bytes.size()), "cannot hand the file image to HDF5");
  return c.own(H5Fopen(unique_image_name("load").c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose,
               "not a readable HDF5 file");
}

herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  try {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

// A link of a group; for a hard link, where its object is, so that opening it skips the
// name lookup (a measurable share of the per-object cost of a load).
#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
using ObjectLocation = H5O_token_t;
#define ENGINE_H5_LITERATE H5Literate2
hid_t open_object_at(hid_t group, const ObjectLocation& at) { return H5Oopen_by_token(group, at); }
ObjectLocation location_of(const LinkInfo& info) { return info.u.token; }
#else
using LinkInfo = H5L_info_t;
using ObjectLocation = haddr_t;
#define ENGINE_H5_LITERATE H5Literate
hid_t open_object_at(hid_t group, const ObjectLocation& at) { return H5Oopen_by_addr(group, at); }
ObjectLocation location_of(const LinkInfo& info) { return info.u.address; }
#endif
struct LinkEntry {
  std::string name;
  H5L_type_t type;
  ObjectLocation location;
};
herr_t collect_link(hid_t, const char* name, const LinkInfo* info, void* out) {
  try {
    LinkEntry entry{name, info->type, {}};
    if (info->type == H5L_TYPE_HARD) entry.location = location_of(*info);
    static_cast<std::vector<LinkEntry>*>(out)->push_back(std::move(entry));
    return 0;
  } catch (...) {
    return -1;
  }
}

// An object below a group, opened by the kind of handle its type needs.
struct Child {
  H5Handle handle;
  H5O_type_t type = H5O_TYPE_UNKNOWN;
  hsize_t num_attrs = 0;
};

// Walks a verified image. Loading is dominated by HDF5's per-call cost, so each object
// is visited with as few calls as the checks allow, and error messages are only built
// on failure.
class ImageReader {
 public:
  // `file` is the verified file the HDF5 image was opened from; tensors stored plainly
  // in it are returned as views of it (see read_tensor).
  // `data_verified`: whether the dataset bytes of the file are verified already (if not,
  // reads of them wait for data_verified()).
  ImageReader(const H5Ctx& c, std::shared_ptr<Bytes> file, bool data_verified)
      : c_(c),
        file_(std::move(file)),
        data_verified_(data_verified),
        half_le_(half_type(c, false)),
        half_be_(half_type(c, true)) {}

  std::vector<std::string> attribute_names(hid_t obj, const std::string& where) {
    std::vector<std::string> names;
    ok(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute_name, &names),
       "cannot list the attributes of ", where);
    return names;
  }

  std::string read_string(hid_t attr, hid_t ftype, const std::string& where) {
    H5Handle mtype = own(H5Tget_native_type(ftype, H5T_DIR_DEFAULT), H5Tclose, "cannot read string ", where);
    const htri_t variable = H5Tis_variable_str(ftype);
    ok(variable, "cannot read string ", where);
    if (variable > 0) {
      char* p = nullptr;
      ok(H5Aread(attr, mtype.get(), &p), "cannot read string ", where);
      std::string s = p ? p : "";
      H5free_memory(p);
      return s;
    }
    std::string s(H5Tget_size(ftype), '\0');
    ok(H5Aread(attr, mtype.get(), s.data()), "cannot read string ", where);
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  Scalar read_attribute(hid_t obj, const std::string& name, const std::string& where) {
    H5Handle attr = own(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "cannot open attribute ", where);
    H5Handle space = own(H5Aget_space(attr.get()), H5Sclose, "cannot read attribute ", where);
    if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
      c_.fail("attribute " + where + " is not a single value (only scalar attributes are allowed)");
    H5Handle ftype = own(H5Aget_type(attr.get()), H5Tclose, "cannot read attribute ", where);
    const H5T_class_t cls = H5Tget_class(ftype.get());
    const std::size_t size = H5Tget_size(ftype.get());
    if (cls == H5T_INTEGER && (size < 8 || H5Tget_sign(ftype.get()) == H5T_SGN_2)) {
      int64_t v = 0;
      ok(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "cannot read attribute ", where);
      return v;
    }
    if (cls == H5T_FLOAT && (type_equals(ftype.get(), H5T_IEEE_F64LE) || type_equals(ftype.get(), H5T_IEEE_F64BE) ||
                             type_equals(ftype.get(), H5T_IEEE_F32LE) || type_equals(ftype.get(), H5T_IEEE_F32BE))) {
      double v = 0;
      ok(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), "cannot read attribute ", where);
      return v;
    }
    if (cls == H5T_STRING) return read_string(attr.get(), ftype.get(), where);
    c_.fail("attribute " + where + " has unsupported type " + describe_type(ftype.get()) +
            " (supported: int64, float64, string)");
  }

  // Reads one group into `out`; `prefix` is the key prefix of its contents ("" or "step/").
  void read_group(hid_t g, hsize_t num_attrs, const std::string& where, const std::string& prefix, StateDict& out,
                  int depth) {
    if (depth > kMaxNesting) c_.fail("groups below " + where + " are nested more than 16 deep");
    if (num_attrs > 0)
      for (const std::string& name : attribute_names(g, where)) {
        const std::string key = prefix + name;
        out.scalars.emplace(key, read_attribute(g, name, where + "@" + name));
      }
    for (const LinkEntry& link : links(g, where)) {
      const std::string at = where + "/" + link.name;
      Child child = open_child(g, link, at);
      const std::string key = prefix + link.name;
      if (child.type == H5O_TYPE_GROUP)
        read_group(child.handle.get(), child.num_attrs, at, key + "/", out, depth + 1);
      else
        read_dataset(child.handle, child.num_attrs, at, key, out);
    }
  }

  // The links of a group in name order (the order h5dump lists them).
  std::vector<LinkEntry> links(hid_t g, const std::string& where) {
    std::vector<LinkEntry> out;
    ok(ENGINE_H5_LITERATE(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_link, &out), "cannot list group ",
       where.empty() ? "/" : where);
    return out;
  }

  // Soft and external links could point anywhere (other files included), and an object
  // linked twice could make the walk loop; neither is ever written by the engine.
  Child open_child(hid_t g, const LinkEntry& link, const std::string& at) {
    if (link.type != H5L_TYPE_HARD) c_.fail(at + " is a soft or external link (only plain objects are allowed)");
    Child child;
    child.handle = own(open_object_at(g, link.location), H5Oclose, "cannot open ", at);
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t oinfo{};
    ok(H5Oget_info3(child.handle.get(), &oinfo, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS), "cannot inspect ", at);
#else
    H5O_info_t oinfo{};
    ok(H5Oget_info2(child.handle.get(), &oinfo, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS), "cannot inspect ", at);
#endif
    if (oinfo.rc != 1) c_.fail(at + " is linked more than once");
    if (oinfo.type != H5O_TYPE_GROUP && oinfo.type != H5O_TYPE_DATASET)
      c_.fail(at + " is neither a group nor a dataset");
    child.type = oinfo.type;
    child.num_attrs = oinfo.num_attrs;
    return child;
  }

  void read_dataset(H5Handle& dataset, hsize_t num_attrs, const std::string& at, const std::string& key,
                    StateDict& out) {
    const hid_t d = dataset.get();
    bool series = false;
    if (num_attrs > 0) {
      const htri_t has_kind = H5Aexists(d, "kind");
      ok(has_kind, "cannot read ", at);
      if (has_kind > 0) {
        const Scalar kind = read_attribute(d, "kind", at + "@kind");
        if (!std::holds_alternative<std::string>(kind) || std::get<std::string>(kind) != "series")
          c_.fail(at + " has an unknown kind attribute (only \"series\" is defined)");
        series = true;
      }
    }

    const Shape shape = read_shape(d, at);
    H5Handle ftype = own(H5Dget_type(d), H5Tclose, "cannot read the type of ", at);
    DType dtype = DType::F32;
    bool as_in_memory = false;
    if (series) {
      if (!type_equals(ftype.get(), H5T_IEEE_F64LE) && !type_equals(ftype.get(), H5T_IEEE_F64BE))
        c_.fail(at + " is a series of " + describe_type(ftype.get()) + " (series are float64)");
      if (shape.size() != 1) c_.fail(at + " is a series of rank " + std::to_string(shape.size()) + " (series are 1-D)");
    } else if (!tensor_dtype(ftype.get(), dtype, as_in_memory)) {
      c_.fail(at + " has unsupported dtype " + describe_type(ftype.get()) +
              " (supported: float32, float16, int32, uint8)");
    }
    if (out.scalars.count(key) || out.tensors.count(key)) c_.fail(at + " repeats key '" + key + "'");

    if (!series) {
      const std::size_t nbytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
      if (Tensor view = as_in_memory ? view_in_file(d, at, shape, dtype, nbytes) : Tensor(); view.defined()) {
        out.tensors.emplace(key, std::move(view));
        return;
      }
      check_stored_here(d, at, nbytes > 0);
      Tensor t = Tensor::empty(shape, dtype, Device::cpu());
      if (nbytes > 0)
        when_data_verified(dataset, [this, t, dtype, at](hid_t opened) mutable {
          H5Handle mtype = memory_type_of(c_, dtype);
          ok(H5Dread(opened, mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()), "cannot read ", at);
        });
      out.tensors.emplace(key, std::move(t));
      return;
    }
    const std::size_t count = static_cast<std::size_t>(shape[0]);
    check_stored_here(d, at, count > 0);
    // Map nodes do not move: the series can be filled in place later.
    auto& values = std::get<std::vector<double>>(out.scalars.emplace(key, std::vector<double>(count)).first->second);
    if (count > 0)
      when_data_verified(dataset, [this, &values, at](hid_t opened) {
        ok(H5Dread(opened, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "cannot read ", at);
      });
  }

  // Reads of dataset bytes (the few not returned as views) wait until the data region of
  // the file has been read and verified; the metadata walk does not.
  void when_data_verified(H5Handle& dataset, std::function<void(hid_t)> read) {
    if (data_verified_) {
      read(dataset.get());
      return;
    }
    deferred_.push_back(Deferred{std::move(dataset), std::move(read)});
  }

  // Called once the whole payload is verified: runs the reads that waited for it.
  void data_verified() {
    data_verified_ = true;
    for (Deferred& d : deferred_) d.read(d.dataset.get());
    deferred_.clear();
  }

  // A tensor stored contiguously in this file, aligned and without conversion (every
  // tensor the engine writes since kDataAlignment, except those under kAlignThreshold
  // bytes), is returned as a view of the file buffer; an undefined tensor otherwise.
  // A defined offset with the full storage size is only reported for contiguous data
  // inside the file (not external, compact, chunked, virtual or unallocated).
  Tensor view_in_file(hid_t d, const std::string& at, const Shape& shape, DType dtype, std::size_t nbytes) {
    if (nbytes == 0 || !file_) return Tensor();
    const haddr_t offset = H5Dget_offset(d);
    if (offset == HADDR_UNDEF || offset < kUserBlockBytes || offset > file_->size() ||
        nbytes > file_->size() - offset || H5Dget_storage_size(d) != nbytes)
      return Tensor();
    unsigned char* data = file_->data() + offset;
    if (reinterpret_cast<std::uintptr_t>(data) % kBufferAlignment != 0) return Tensor();
    views_.push_back(View{static_cast<std::size_t>(offset), nbytes, at});
    return Tensor::wrap_host(file_, data, shape, dtype);
  }

  // Data kept outside this file would be read from wherever it points, and data never
  // written would read as fill values.
  void check_stored_here(hid_t d, const std::string& at, bool has_elements) {
    H5Handle dcpl = own(H5Dget_create_plist(d), H5Pclose, "cannot read the layout of ", at);
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
      c_.fail(at + " has an unsupported storage layout (virtual or unknown)");
    if (H5Pget_external_count(dcpl.get()) != 0) c_.fail(at + " keeps its data in external files");
    if (has_elements) {
      H5D_space_status_t status{};
      ok(H5Dget_space_status(d, &status), "cannot read ", at);
      if (status == H5D_SPACE_STATUS_NOT_ALLOCATED) c_.fail(at + " has no stored data");
    }
  }

  // HDF5 never stores two datasets in the same bytes; a crafted file that does would
  // make two loaded tensors share memory, so it is refused.
  void check_views_disjoint() {
    std::sort(views_.begin(), views_.end(), [](const View& a, const View& b) { return a.offset < b.offset; });
    for (std::size_t i = 1; i < views_.size(); ++i)
      if (views_[i].offset < views_[i - 1].offset + views_[i - 1].bytes)
        c_.fail(corrupt(views_[i - 1].at + " and " + views_[i].at + " share stored bytes"));
  }

  // The shape, refused before anything is allocated if absurd.
  Shape read_shape(hid_t d, const std::string& at) {
    H5Handle space = own(H5Dget_space(d), H5Sclose, "cannot read the shape of ", at);
    // Every call into HDF5 costs, and loading is made of them: one call gets the rank and
    // the dims (HDF5 never has more than H5S_MAX_RANK), the class only when rank is 0.
    hsize_t dims[H5S_MAX_RANK] = {};
    const int rank = H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    if (rank < 0) c_.fail("cannot read the shape of " + at + hdf5_reason());
    if (rank == 0) {
      const H5S_class_t cls = H5Sget_simple_extent_type(space.get());
      if (cls == H5S_SCALAR) return {};
      c_.fail(at + " has no shape (null dataspace)");
    }
    if (rank > kMaxRank) c_.fail(at + " has rank " + std::to_string(rank) + " (at most 8)");
    uint64_t total = 1;
    for (int i = 0; i < rank; ++i) {
      if (dims[i] > kMaxElements || (total *= dims[i]) > kMaxElements) {  // both factors <= 2^31: no overflow
        std::string text = "[";
        for (int j = 0; j < rank; ++j) text += (j ? ", " : "") + std::to_string(dims[j]);
        c_.fail(at + " has shape " + text + "], more than 2^31 elements");
      }
    }
    return Shape(dims, dims + rank);
  }

  // The dtype a tensor dataset loads as; false if unsupported.
  // The dtype a tensor dataset loads as (false if unsupported), and whether its stored
  // bytes are the bytes of the tensor in memory (little-endian, as the engine writes).
  bool tensor_dtype(hid_t ftype, DType& dtype, bool& as_in_memory) {
    as_in_memory = false;
    if (type_equals(ftype, H5T_IEEE_F32LE)) {  // nearly every tensor: one call
      dtype = DType::F32;
      as_in_memory = true;
      return true;
    }
    const H5T_class_t cls = H5Tget_class(ftype);
    const std::size_t size = H5Tget_size(ftype);
    if (cls == H5T_FLOAT && size == 4 && type_equals(ftype, H5T_IEEE_F32BE)) {
      dtype = DType::F32;
    } else if (cls == H5T_FLOAT && size == 2 && (type_equals(ftype, half_le_.get()) || type_equals(ftype, half_be_.get()))) {
      dtype = DType::F16;
    } else if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(ftype) == H5T_SGN_2) {
      dtype = DType::I32;
    } else if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(ftype) == H5T_SGN_NONE) {
      dtype = DType::U8;
    } else {
      return false;
    }
    as_in_memory = stored_as_in_memory(ftype, dtype);
    return true;
  }

 private:
  // Whether the bytes in the file are exactly the bytes of the tensor in memory.
  bool stored_as_in_memory(hid_t ftype, DType dtype) const {
    switch (dtype) {
      case DType::F32: return type_equals(ftype, H5T_IEEE_F32LE);
      case DType::F16: return type_equals(ftype, half_le_.get());
      case DType::I32: return type_equals(ftype, H5T_STD_I32LE);
      case DType::U8: return true;
    }
    return false;
  }

  void ok(herr_t r, const char* what, const std::string& at) const {
    if (r < 0) c_.fail(what + at + hdf5_reason());
  }
  H5Handle own(hid_t id, H5Handle::Closer close, const char* what, const std::string& at) const {
    if (id < 0) c_.fail(what + at + hdf5_reason());
    return H5Handle(id, close);
  }

  struct View {
    std::size_t offset, bytes;
    std::string at;
  };
  struct Deferred {
    H5Handle dataset;
    std::function<void(hid_t)> read;
  };
  const H5Ctx& c_;
  std::shared_ptr<Bytes> file_;
  bool data_verified_;
  std::vector<Deferred> deferred_;
  std::vector<View> views_;
  H5Handle half_le_, half_be_;
};

std::string require_string(const H5Ctx& c, const Scalar& s, const char* name) {
  if (auto p = std::get_if<std::string>(&s)) return *p;
  c.fail(std::string("root attribute ") + name + " is " + scalar_kind(s) + ", expected string");
}

// Upgrades from older layouts, keyed by the version they upgrade from; a layout change
// adds one here (see the format doc).
using Upgrade = void (*)(Checkpoint&);
const std::map<int64_t, Upgrade>& upgrades() {
  static const std::map<int64_t, Upgrade> table = {
      // Version 2 changed only the user-block header (metadata_bytes, metadata_crc32).
      {1, [](Checkpoint&) {}},
  };
  return table;
}

// Reads a checkpoint from an open image whose metadata is verified. `wait_for_data`
// returns (or throws) once the rest of the file is read and verified; it is null when
// that is already so.
Checkpoint read_checkpoint(const H5Ctx& c, hid_t file, const Header& header, std::shared_ptr<Bytes> bytes,
                           const std::function<void()>& wait_for_data) {
  ImageReader r(c, std::move(bytes), !wait_for_data);
  H5Handle root = c.own(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose, "cannot open the root group");
  std::map<std::string, Scalar> attrs;
  for (const char* name : kRootAttributes) {
    const htri_t exists = H5Aexists(root.get(), name);
    c.ok(exists, std::string("cannot read root attribute ") + name);
    if (exists == 0) c.fail(std::string("missing root attribute '") + name + "'");
    attrs.emplace(name, r.read_attribute(root.get(), name, std::string("/@") + name));
  }
  const std::string format = require_string(c, attrs["format"], "format");
  if (format != kFormatName) c.fail("root attribute format is '" + format + "', expected '" + kFormatName + "'");
  const int64_t* version = std::get_if<int64_t>(&attrs["format_version"]);
  if (!version) c.fail("root attribute format_version is not an int64");
  if (*version != header.format_version)
    c.fail(corrupt("format_version is " + std::to_string(header.format_version) + " in the header but " +
                   std::to_string(*version) + " in the root attribute"));

  Checkpoint ckpt;
  ckpt.meta.format_version = *version;
  ckpt.meta.engine_version = require_string(c, attrs["engine_version"], "engine_version");
  ckpt.meta.created_utc = require_string(c, attrs["created_utc"], "created_utc");
  ckpt.meta.saved_on = require_string(c, attrs["saved_on"], "saved_on");
  ckpt.config_json = require_string(c, attrs["config"], "config");

  for (const std::string& g : checkpoint_required_groups()) {
    const htri_t exists = H5Lexists(root.get(), g.c_str(), H5P_DEFAULT);
    c.ok(exists, "cannot look up group /" + g);
    if (exists == 0) c.fail("missing group /" + g);
  }
  for (const LinkEntry& link : r.links(root.get(), "")) {
    const std::string at = "/" + link.name;
    Child child = r.open_child(root.get(), link, at);
    if (child.type != H5O_TYPE_GROUP) c.fail(at + " is not a group (only groups belong at the root)");
    r.read_group(child.handle.get(), child.num_attrs, at, "", ckpt.groups[link.name], 1);
  }
  if (wait_for_data) {
    wait_for_data();
    r.data_verified();
  }
  r.check_views_disjoint();
  normalise_keys(c.path, ckpt.groups);
  for (int64_t v = *version; v < kCheckpointFormatVersion; ++v) {
    auto it = upgrades().find(v);
    if (it == upgrades().end()) c.fail("no upgrade from format_version " + std::to_string(v));
    it->second(ckpt);
  }
  return ckpt;
}

// ---------------------------------------------------------------------------------
// Atomic write.

// Writes everything or returns false with errno set.
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

// Like write_fully_at, in 1 MiB pieces, each handed to the disk as soon as it is in the
// page cache (Linux), so that most of the data is on its way when fsync is called.
int write_with_early_writeback(int fd, const unsigned char* data, std::size_t n, off_t offset) {
  constexpr std::size_t kPiece = std::size_t(1) << 20;
  while (n > 0) {
    const std::size_t piece = std::min(n, kPiece);
    if (const int err = write_fully_at(fd, data, piece, offset)) return err;
#if defined(__linux__)
    (void)::sync_file_range(fd, offset, static_cast<off_t>(piece), SYNC_FILE_RANGE_WRITE);  // a hint only
#endif
    data += piece;
    n -= piece;
    offset += static_cast<off_t>(piece);
  }
  return 0;
}

// Writes a checkpoint image into `fd`: the HDF5 payload first, while a second thread
// takes its CRC-32 from the same memory, then the sealed header in front of it (the
// file is still a temporary, so the order is invisible). 0 or the errno of a failure.
int write_sealed(int fd, Bytes& image, std::size_t metadata_bytes, int64_t format_version) {
  const unsigned char* payload = image.data() + kUserBlockBytes;
  const std::size_t payload_bytes = image.size() - kUserBlockBytes;
  int err = 0;
  PayloadChecksums sums;
  auto write = [&] { err = write_with_early_writeback(fd, payload, payload_bytes, static_cast<off_t>(kUserBlockBytes)); };
  auto checksum = [&] { sums = checksums_of(payload, payload_bytes, metadata_bytes); };
  if (payload_bytes >= (std::size_t(1) << 20)) {
    side_by_side(write, checksum);
  } else {
    write();
    checksum();
  }
  if (err != 0) return err;
  seal_with(image, format_version, sums);
  return write_fully_at(fd, image.data(), kUserBlockBytes, 0);
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

void save_impl(const std::string& path, const Checkpoint& ckpt, const checkpoint_testing::Tamper& tamper) {
  Hdf5Session session;
  const H5Ctx c{path};
  check_for_save(path, ckpt, tamper.omit_groups.empty());
  Checkpoint normalised = ckpt;  // shares tensor storage; only keys change
  normalise_keys(path, normalised.groups);
  for (const auto& [group, d] : normalised.groups) check_group_keys(path, group, d);
  BuiltImage built = build_image(c, normalised, tamper);
  Bytes& image = built.bytes;
  atomic_write(path, [&](int fd) {
    return tamper.plain_hdf5 ? write_fully_at(fd, image.data(), image.size(), 0)
                             : write_sealed(fd, image, built.metadata_bytes, tamper.format_version);
  });
  SpareImage::give_back(std::move(image));
}

// ---------------------------------------------------------------------------------
// Inspect and diff.

double half_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(man, -24);
  else if (exp == 31) v = man ? std::nan("") : INFINITY;
  else v = std::ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.f32()[i];
    case DType::F16: return half_to_double(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::I32: return t.i32()[i];
    case DType::U8: return t.u8()[i];
  }
  return 0;
}

double l2_norm(const Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = element(t, i);
    sum += x * x;
  }
  return std::sqrt(sum);
}

std::string scalar_text(const Scalar& s) {
  if (auto i = std::get_if<int64_t>(&s)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&s)) return fmt_double(*d);
  if (auto str = std::get_if<std::string>(&s)) return "\"" + *str + "\"";
  const auto& v = std::get<std::vector<double>>(s);
  return std::to_string(v.size()) + " values" + (v.empty() ? "" : ", last " + fmt_double(v.back()));
}

// Required groups in their documented order, then any others.
std::vector<std::string> group_order(const std::set<std::string>& present) {
  std::vector<std::string> order;
  for (const std::string& g : checkpoint_required_groups())
    if (present.count(g)) order.push_back(g);
  for (const std::string& g : present)
    if (std::find(order.begin(), order.end(), g) == order.end()) order.push_back(g);
  return order;
}

std::set<std::string> group_names(const Checkpoint& c) {
  std::set<std::string> s;
  for (const auto& kv : c.groups) s.insert(kv.first);
  return s;
}

bool same_bits(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// "identical", or what differs; sets `differs`.
std::string compare_tensors(const Tensor& a, const Tensor& b, bool& differs) {
  differs = true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return std::string("mismatch: ") + dtype_name(a.dtype()) + shape_str(a.shape()) + " vs " + dtype_name(b.dtype()) +
           shape_str(b.shape());
  if (same_bits(a.raw(), b.raw(), a.nbytes())) {
    differs = false;
    return "identical";
  }
  const std::size_t esize = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.raw());
  const auto* pb = static_cast<const unsigned char*>(b.raw());
  double largest = 0;
  int64_t count = 0, nan_mismatch = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (same_bits(pa + i * esize, pb + i * esize, esize)) continue;
    ++count;  // includes 0.0 vs -0.0 and NaNs with different payloads
    const double x = element(a, i), y = element(b, i);
    if (std::isnan(x) || std::isnan(y)) ++nan_mismatch;
    else largest = std::max(largest, std::fabs(x - y));
  }
  std::string text = "max abs diff " + fmt_short(largest) + " (" + std::to_string(count) + " of " +
                     std::to_string(a.numel()) + " elements differ";
  if (nan_mismatch) text += ", " + std::to_string(nan_mismatch) + " involve NaN";
  return text + ")";
}

std::string compare_scalars(const Scalar& a, const Scalar& b, bool& differs) {
  differs = true;
  if (a.index() != b.index()) return std::string("mismatch: ") + scalar_kind(a) + " vs " + scalar_kind(b);
  if (auto x = std::get_if<int64_t>(&a)) {
    const int64_t y = std::get<int64_t>(b);
    if (*x == y) return differs = false, "identical";
    return std::to_string(*x) + " vs " + std::to_string(y);
  }
  if (auto x = std::get_if<double>(&a)) {
    const double y = std::get<double>(b);
    if (same_bits(x, &y, sizeof y)) return differs = false, "identical";
    return fmt_double(*x) + " vs " + fmt_double(y) + " (abs diff " + fmt_short(std::fabs(*x - y)) + ")";
  }
  if (auto x = std::get_if<std::string>(&a)) {
    if (*x == std::get<std::string>(b)) return differs = false, "identical";
    return "\"" + *x + "\" vs \"" + std::get<std::string>(b) + "\"";
  }
  const auto& va = std::get<std::vector<double>>(a);
  const auto& vb = std::get<std::vector<double>>(b);
  if (va.size() != vb.size())
    return "series length " + std::to_string(va.size()) + " vs " + std::to_string(vb.size());
  if (same_bits(va.data(), vb.data(), va.size() * sizeof(double))) return differs = false, "identical";
  double largest = 0;
  for (std::size_t i = 0; i < va.size(); ++i)
    if (!std::isnan(va[i]) && !std::isnan(vb[i])) largest = std::max(largest, std::fabs(va[i] - vb[i]));
  return "series max abs diff " + fmt_short(largest);
}

// Wall-clock measurements (metrics series named *_seconds) differ between runs with the
// same state, so diff lists them without counting them.
bool is_wall_clock(const std::string& group, const std::string& key) {
  const std::string suffix = "_seconds";
  return group == "metrics" && key.size() > suffix.size() &&
         key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void flatten_json(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items()) flatten_json(value, prefix.empty() ? key : prefix + "." + key, out);
  } else {
    out[prefix] = j.dump();
  }
}

// "differs at a.b (x vs y), c.d (...)" naming the dotted keys, or "differs" for non-JSON.
std::string config_difference(const std::string& a, const std::string& b) {
  std::map<std::string, std::string> fa, fb;
  try {
    flatten_json(nlohmann::json::parse(a), "", fa);
    flatten_json(nlohmann::json::parse(b), "", fb);
  } catch (const std::exception&) {
    return "differs";
  }
  std::set<std::string> keys;
  for (const auto& kv : fa) keys.insert(kv.first);
  for (const auto& kv : fb) keys.insert(kv.first);
  std::string text;
  int shown = 0, total = 0;
  for (const std::string& key : keys) {
    const auto ia = fa.find(key), ib = fb.find(key);
    const std::string va = ia == fa.end() ? "absent" : ia->second, vb = ib == fb.end() ? "absent" : ib->second;
    if (va == vb) continue;
    if (++total > 8) continue;
    text += std::string(shown++ ? ", " : "") + key + " (" + va + " vs " + vb + ")";
  }
  if (total > shown) text += ", and " + std::to_string(total - shown) + " more";
  return total ? "differs at " + text : "differs only in formatting";
}

}  // namespace

// -----------------------------------------------------------------------------------
// Public API.

const std::vector<std::string>& checkpoint_required_groups() {
  static const std::vector<std::string> groups = {"model", "optimizer", "scheduler", "scaler",
                                                  "rng",   "trainer",   "metrics"};
  return groups;
}

std::string strip_wrapper_prefixes(const std::string& name) {
  std::string s = name;
  for (bool again = true; again;) {
    again = false;
    for (const char* prefix : {"_orig_mod.", "module."}) {
      if (starts_with(s, prefix) && s.size() > std::strlen(prefix)) {
        s.erase(0, std::strlen(prefix));
        again = true;
      }
    }
  }
  return s;
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  save_impl(path, ckpt, checkpoint_testing::Tamper{});
}

// Reading a checkpoint: the header, then the HDF5 metadata (metadata_bytes after the
// header) and its checksum. libhdf5 never parses the file in this process: the parser
// process (io/hdf5_sandbox.h) walks the metadata into a manifest while this thread
// reads and checks the dataset bytes, and the checkpoint is assembled from the
// manifest with every shape, offset and length checked against the verified buffer
// (docs/security.md). Loaded tensors point into the buffer.
Checkpoint load_checkpoint(const std::string& path) {
  // HDF5 reads some structures 512 bytes at a time from where they start; the parser is
  // given the bytes just past the metadata too, as it would read them from the file.
  constexpr std::size_t kMetadataMargin = std::size_t(64) << 10;
  constexpr std::size_t kHalvesFrom = std::size_t(1) << 20;
  FileReader reader(path);
  const std::size_t size = reader.size();
  unsigned char header_bytes[kUserBlockBytes];
  const std::size_t header_read = reader.read_header(header_bytes);
  const Header header = parse_header(path, header_bytes, size);
  reader.allocate(header_bytes, header_read);
  const std::size_t metadata_end = kUserBlockBytes + header.metadata_bytes;
  const std::size_t margin_end = std::min(size, metadata_end + kMetadataMargin);
  unsigned char* const file = reader.bytes()->data();
  using hdf5_sandbox::ImageContent;
  using hdf5_sandbox::Outcome;

  hdf5_sandbox::Reply reply;
  if (margin_end == size) {  // nothing to overlap: read and check everything first
    uint32_t metadata_crc = 0, data_crc = 0;
    if (metadata_end == size && size >= kHalvesFrom)
      metadata_crc = reader.read_in_halves(kUserBlockBytes, size);
    else
      reader.read(kUserBlockBytes, size, metadata_end, metadata_crc, data_crc);
    reader.check_not_grown();
    check_checksum(path, "metadata", metadata_crc, header.metadata_crc);
    check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    reply = hdf5_sandbox::parse(file, size, size, ImageContent::Complete);
  } else {
    uint32_t metadata_crc = 0, margin_crc = 0, rest_crc = 0;
    reader.read(kUserBlockBytes, margin_end, metadata_end, metadata_crc, margin_crc);
    check_checksum(path, "metadata", metadata_crc, header.metadata_crc);
    hdf5_sandbox::start(file, margin_end, size, ImageContent::MetadataOnly);
    try {
      uint32_t none = 0;
      reader.read(margin_end, size, margin_end, none, rest_crc);
      reader.check_not_grown();
      const uint32_t data_crc = crc_join(margin_crc, rest_crc, size - margin_end);
      check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    } catch (...) {
      (void)hdf5_sandbox::finish();
      throw;
    }
    reply = hdf5_sandbox::finish();
    // Chunked data is read through HDF5, so the parser needs the whole file; and a
    // writer that understated metadata_bytes gets the file's real answer from a walk of
    // all of it.
    if (reply.outcome == Outcome::NeedsData || reply.outcome == Outcome::Refused)
      reply = hdf5_sandbox::parse(file, size, size, ImageContent::Complete);
  }
  if (reply.outcome != Outcome::Parsed)
    fail(path, reply.outcome == Outcome::NeedsData ? "the HDF5 parser asked for data it already has" : reply.message);
  Checkpoint ckpt = assemble_checkpoint(path, reply.manifest, reader.bytes(), file, size, header.format_version);
  normalise_keys(path, ckpt.groups);
  for (int64_t v = ckpt.meta.format_version; v < kCheckpointFormatVersion; ++v) {
    auto it = upgrades().find(v);
    if (it == upgrades().end()) fail(path, "no upgrade from format_version " + std::to_string(v));
    it->second(ckpt);
  }
  return ckpt;
}

void verify_checkpoint_file(const std::string& path) { (void)load_checkpoint(path); }

std::string inspect_checkpoint(const std::string& path) {
  const Checkpoint ck = load_checkpoint(path);
  struct stat st {};
  const long long bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
  std::ostringstream o;
  o << "checkpoint " << path << "\n";
  o << "  file            " << bytes << " bytes, checksum ok\n";
  o << "  format_version  " << ck.meta.format_version << "\n";
  o << "  engine_version  " << ck.meta.engine_version << "\n";
  o << "  created_utc     " << ck.meta.created_utc << "\n";
  o << "  saved_on        " << ck.meta.saved_on << "\n";
  o << "  config          " << ck.config_json.size() << " bytes of JSON\n";
  for (const std::string& g : group_order(group_names(ck))) {
    const StateDict& d = ck.groups.at(g);
    o << "[" << g << "] " << d.tensors.size() << " tensors, " << d.scalars.size() << " scalars\n";
    std::size_t width = 0;
    for (const auto& kv : d.scalars) width = std::max(width, kv.first.size());
    for (const auto& kv : d.tensors) width = std::max(width, kv.first.size());
    auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w + 2 - std::min(w, s.size()), ' '); };
    for (const auto& [key, s] : d.scalars)
      o << "  " << pad(key, width) << pad(is_series(s) ? "series" : scalar_kind(s), 7) << scalar_text(s) << "\n";
    for (const auto& [key, t] : d.tensors)
      o << "  " << pad(key, width) << pad(dtype_name(t.dtype()), 7) << shape_str(t.shape()) << "  norm "
        << fmt_short(l2_norm(t)) << "\n";
  }
  return o.str();
}

CheckpointDiff diff_checkpoints(const std::string& path_a, const std::string& path_b) {
  const Checkpoint a = load_checkpoint(path_a);
  const Checkpoint b = load_checkpoint(path_b);
  std::ostringstream o;
  int differing = 0;
  o << "a: " << path_a << "\n" << "b: " << path_b << "\n";
  // The verdict is about state: metadata and config are listed, never counted (two
  // runs with different run directories can still hold bit-identical state).
  auto meta = [&](const char* name, const std::string& x, const std::string& y) {
    if (x != y) o << "meta " << name << ": \"" << x << "\" vs \"" << y << "\" (ignored)\n";
  };
  meta("format_version", std::to_string(a.meta.format_version), std::to_string(b.meta.format_version));
  meta("engine_version", a.meta.engine_version, b.meta.engine_version);
  meta("created_utc", a.meta.created_utc, b.meta.created_utc);
  meta("saved_on", a.meta.saved_on, b.meta.saved_on);
  if (a.config_json != b.config_json) o << "config: " << config_difference(a.config_json, b.config_json) << " (ignored)\n";

  std::set<std::string> groups = group_names(a);
  for (const auto& kv : b.groups) groups.insert(kv.first);
  const StateDict empty;
  for (const std::string& g : group_order(groups)) {
    const StateDict& da = a.groups.count(g) ? a.groups.at(g) : empty;
    const StateDict& db = b.groups.count(g) ? b.groups.at(g) : empty;
    if (!a.groups.count(g) || !b.groups.count(g)) {
      o << g << ": group only in " << (a.groups.count(g) ? "a" : "b") << "\n";
      ++differing;
    }
    auto line = [&](const std::string& key, const std::string& verdict, bool differs) {
      o << g << "/" << key << ": " << verdict << "\n";
      if (differs) ++differing;
    };
    std::set<std::string> keys;
    for (const auto& kv : da.scalars) keys.insert(kv.first);
    for (const auto& kv : db.scalars) keys.insert(kv.first);
    for (const std::string& key : keys) {
      auto ia = da.scalars.find(key), ib = db.scalars.find(key);
      if (ia == da.scalars.end() || ib == db.scalars.end()) {
        line(key, ia == da.scalars.end() ? "only in b" : "only in a", true);
        continue;
      }
      bool differs = false;
      const std::string verdict = compare_scalars(ia->second, ib->second, differs);
      if (differs && is_wall_clock(g, key))
        line(key, verdict + " (ignored: wall-clock time)", false);
      else
        line(key, verdict, differs);
    }
    keys.clear();
    for (const auto& kv : da.tensors) keys.insert(kv.first);
    for (const auto& kv : db.tensors) keys.insert(kv.first);
    for (const std::string& key : keys) {
      auto ia = da.tensors.find(key), ib = db.tensors.find(key);
      if (ia == da.tensors.end() || ib == db.tensors.end()) {
        line(key, ia == da.tensors.end() ? "only in b" : "only in a", true);
        continue;
      }
      bool differs = false;
      const std::string verdict = compare_tensors(ia->second, ib->second, differs);
      line(key, verdict, differs);
    }
  }
  CheckpointDiff result;
  result.identical = differing == 0;
  if (result.identical)
    o << "verdict: identical\n";
  else
    o << "verdict: different (" << differing << (differing == 1 ? " entry differs)\n" : " entries differ)\n");
  result.report = o.str();
  return result;
}

void checkpoint_testing::save_tampered(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper) {
  save_impl(path, ckpt, tamper);
}

void checkpoint_testing::reseal(const std::string& path, int64_t format_version) {
  FileReader reader(path);
  unsigned char header_bytes[kUserBlockBytes];
  const std::size_t header_read = reader.read_header(header_bytes);
  if (header_read < kUserBlockBytes) fail(path, "too short to reseal");
  reader.allocate(header_bytes, header_read);
  uint32_t unused_before = 0, unused_after = 0;
  reader.read(kUserBlockBytes, reader.size(), reader.size(), unused_before, unused_after);
  Bytes& bytes = *reader.bytes();
  seal(bytes, format_version);
  atomic_write(path, [&](int fd) { return write_fully_at(fd, bytes.data(), bytes.size(), 0); });
}

}  // namespace engine
