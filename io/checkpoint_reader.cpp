// Reading a checkpoint: the file into one buffer, checked against its header, then the
// HDF5 image walked with every structural check of docs/checkpoint-format.md.
#include "io/checkpoint_internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>

#include "io/crc32.h"

namespace engine {
namespace checkpoint_internal {
namespace {

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
  // Opened without blocking (a FIFO with no writer would wait forever) and refused
  // unless it is a regular file; a refusal closes what it opened.
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    std::string refusal;
    if (fstat(fd_, &st) != 0) refusal = std::string("cannot stat: ") + std::strerror(errno);
    else if (S_ISDIR(st.st_mode)) refusal = "is a directory, not a file";
    else if (!S_ISREG(st.st_mode)) refusal = "not a regular file (a FIFO, socket or device)";
    if (!refusal.empty()) {
      ::close(fd_);
      fail(path, refusal);
    }
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

}  // namespace

// The same checks as load_checkpoint, on bytes already in memory: no overlap of reading
// and walking to arrange, so the checksums are taken first and the image walked after.
Checkpoint load_checkpoint_from_bytes(const std::string& name, const unsigned char* data, std::size_t size) {
  Hdf5Session session;
  const H5Ctx c{name};
  const Header header = parse_header(name, data, size);
  auto bytes = std::make_shared<Bytes>(size);
  std::memcpy(bytes->data(), data, size);
  const std::size_t metadata_end = kUserBlockBytes + header.metadata_bytes;
  const uint32_t metadata_crc = crc32_update(0, bytes->data() + kUserBlockBytes, header.metadata_bytes);
  const uint32_t data_crc = crc32_update(0, bytes->data() + metadata_end, size - metadata_end);
  check_checksum(name, "metadata", metadata_crc, header.metadata_crc);
  check_checksum(name, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
  LentImage lent{};
  H5Handle file = open_image(c, *bytes, lent);
  return read_checkpoint(c, file.get(), header, std::move(bytes), nullptr);
}

}  // namespace checkpoint_internal

using namespace checkpoint_internal;

// Reading a checkpoint: the header, then the HDF5 metadata (metadata_bytes after the
// header), checked before HDF5 sees it, then the dataset bytes. For a large version-2
// file the dataset bytes are read and checked on a second thread while the first walks
// the metadata (loaded tensors point into the buffer, so the walk needs only their
// offsets); the few reads of dataset bytes through HDF5 wait for that check, and nothing
// is returned before the whole payload has passed it.
Checkpoint load_checkpoint(const std::string& path) {
  constexpr std::size_t kOverlapFrom = std::size_t(1) << 20;
  // HDF5 reads some structures 512 bytes at a time from where they start; the bytes just
  // past the metadata are read with it, so such reads never meet bytes being written.
  constexpr std::size_t kMetadataMargin = std::size_t(64) << 10;
  Hdf5Session session;
  const H5Ctx c{path};
  FileReader reader(path);
  const std::size_t size = reader.size();
  unsigned char header_bytes[kUserBlockBytes];
  const std::size_t header_read = reader.read_header(header_bytes);
  const Header header = parse_header(path, header_bytes, size);
  reader.allocate(header_bytes, header_read);
  const std::size_t metadata_end = kUserBlockBytes + header.metadata_bytes;
  LentImage lent{};

  if (metadata_end == size || size < kOverlapFrom || omp_get_max_threads() < 2) {
    uint32_t metadata_crc = 0, data_crc = 0;
    if (metadata_end == size && size >= kOverlapFrom)
      metadata_crc = reader.read_in_halves(kUserBlockBytes, size);
    else
      reader.read(kUserBlockBytes, size, metadata_end, metadata_crc, data_crc);
    reader.check_not_grown();
    check_checksum(path, "metadata", metadata_crc, header.metadata_crc);
    check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    H5Handle file = open_image(c, *reader.bytes(), lent);
    return read_checkpoint(c, file.get(), header, reader.bytes(), nullptr);
  }

  const std::size_t margin_end = std::min(size, metadata_end + kMetadataMargin);
  uint32_t metadata_crc = 0, margin_crc = 0, rest_crc = 0;
  reader.read(kUserBlockBytes, margin_end, metadata_end, metadata_crc, margin_crc);
  check_checksum(path, "metadata", metadata_crc, header.metadata_crc);

  // Whichever thread comes first reads the rest: the second one, or the first one when it
  // needs the data and no second thread was given.
  std::atomic<bool> claimed{false};
  std::mutex done_mutex;
  std::condition_variable done_signal;
  bool done = false;  // guarded by done_mutex
  std::exception_ptr read_error, walk_error;
  auto read_rest = [&] {
    if (claimed.exchange(true)) return;
    try {
      uint32_t none = 0;
      reader.read(margin_end, size, margin_end, none, rest_crc);
      reader.check_not_grown();
    } catch (...) {
      read_error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(done_mutex);
      done = true;
    }
    done_signal.notify_all();
  };
  bool data_checked = false;
  auto wait_for_data = [&] {
    if (data_checked) return;
    read_rest();
    {
      std::unique_lock<std::mutex> lock(done_mutex);
      done_signal.wait(lock, [&] { return done; });
    }
    if (read_error) std::rethrow_exception(read_error);
    const uint32_t data_crc = crc_join(margin_crc, rest_crc, size - margin_end);
    check_checksum(path, "payload", crc_join(metadata_crc, data_crc, size - metadata_end), header.payload_crc);
    data_checked = true;
  };
  Checkpoint result;
  auto walk = [&] {
    try {
      H5Handle file = open_image(c, *reader.bytes(), lent);
      result = read_checkpoint(c, file.get(), header, reader.bytes(), wait_for_data);
    } catch (...) {
      walk_error = std::current_exception();
    }
    // A walk that failed before the data was in may have met metadata past
    // metadata_bytes (a writer that got it wrong): with all of the file read and
    // checked, the second walk gives the file's real answer.
    if (walk_error && !data_checked) {
      try {
        wait_for_data();
        H5Handle file = open_image(c, *reader.bytes(), lent);
        result = read_checkpoint(c, file.get(), header, reader.bytes(), nullptr);
        walk_error = nullptr;
      } catch (...) {
        walk_error = std::current_exception();
      }
    }
  };
  // The walk stays on the calling thread: HDF5's error settings (Hdf5Session) are per thread.
  side_by_side(walk, read_rest);
  if (walk_error) std::rethrow_exception(walk_error);
  return result;
}

}  // namespace engine
