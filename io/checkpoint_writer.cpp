// Writing a checkpoint: the HDF5 image built in memory (docs/checkpoint-format.md,
// section 2), sealed with its header, and written atomically (io/atomic_file.h).
#include "io/aligned_bytes.h"
#include "core/utc_time.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"
#include "io/checkpoint_header.h"
#include "io/side_by_side.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>

#include "io/atomic_file.h"
#include "io/checkpoint_copies.h"

namespace engine {
namespace checkpoint_internal {
namespace {

void check_no_nul(const std::string& path, const std::string& what, const std::string& text) {
  if (text.find('\0') != std::string::npos) fail(path, what + " contains a NUL character");
}

void check_for_save(const std::string& path, const Checkpoint& ckpt) {
  if (ckpt.meta.saved_on.empty()) fail(path, "meta.saved_on is empty; set it to the training device (\"cpu\", \"cuda:0\")");
  check_no_nul(path, "meta.saved_on", ckpt.meta.saved_on);
  check_no_nul(path, "config_json", ckpt.config_json);
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

BuiltImage build_image(const H5Ctx& c, const Checkpoint& ckpt, const std::string& created_utc) {
  H5Handle fcpl = c.plist(H5P_FILE_CREATE, "a file property list");
  c.ok(H5Pset_userblock(fcpl.get(), kUserBlockBytes), "cannot reserve the user block");
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
        {"format_version", kCheckpointFormatVersion},
        {"engine_version", std::string(ENGINE_VERSION)},
        {"created_utc", created_utc},
        {"saved_on", ckpt.meta.saved_on},
        {"config", ckpt.config_json},
    };
    for (const char* name : kRootAttributes) w.write_attribute(root.get(), name, attrs.at(name), std::string("/@") + name);
    for (const auto& [group, d] : ckpt.groups) w.write_group(root.get(), group, d);

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
  const std::size_t userblock = kUserBlockBytes;
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

// Like write_fully_at, in 1 MiB pieces, each handed to the disk as soon as it is in the
// page cache (Linux), so that most of the data is on its way when fsync is called.
int write_with_early_writeback(Env& env, int fd, const unsigned char* data, std::size_t n, off_t offset) {
  constexpr std::size_t kPiece = std::size_t(1) << 20;
  while (n > 0) {
    const std::size_t piece = std::min(n, kPiece);
    if (const int err = write_fully_at(env, fd, data, piece, offset)) return err;
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
int write_sealed(Env& env, int fd, Bytes& image, std::size_t metadata_bytes, int64_t format_version) {
  const unsigned char* payload = image.data() + kUserBlockBytes;
  const std::size_t payload_bytes = image.size() - kUserBlockBytes;
  int err = 0;
  PayloadChecksums sums;
  auto write = [&] {
    err = write_with_early_writeback(env, fd, payload, payload_bytes, static_cast<off_t>(kUserBlockBytes));
  };
  auto checksum = [&] { sums = checksums_of(payload, payload_bytes, metadata_bytes); };
  if (payload_bytes >= (std::size_t(1) << 20)) {
    side_by_side(write, checksum);
  } else {
    write();
    checksum();
  }
  if (err != 0) return err;
  seal_with(image, format_version, sums);
  return write_fully_at(env, fd, image.data(), kUserBlockBytes, 0);
}

}  // namespace

}  // namespace checkpoint_internal

using namespace checkpoint_internal;

namespace checkpoint_internal {

std::vector<std::exception_ptr> save_checkpoint_copies(const std::vector<std::string>& paths, const Checkpoint& ckpt,
                                                       Env* env_given, std::string* sealed_image) {
  Env& env = env_or_posix(env_given);
  std::vector<std::exception_ptr> errors(paths.size());
  if (paths.empty()) return errors;
  const std::string& path = paths.front();
  Hdf5Session session;
  const H5Ctx c{path};
  check_for_save(path, ckpt);
  Checkpoint normalised = ckpt;  // shares tensor storage; only keys change
  normalise_keys(path, normalised.groups);
  for (const auto& [group, d] : normalised.groups) check_group_keys(path, group, d);
  BuiltImage built = build_image(c, normalised, utc_text(env.wall_now(), UtcFormat::Iso8601));
  Bytes& image = built.bytes;
  // The first write seals the image (its checksums go into the header); each copy is
  // then the same sealed bytes, so every tier holds the same file.
  bool sealed = false;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    try {
      atomic_write(env, paths[i], [&](int fd) {
        if (sealed) return write_fully_at(env, fd, image.data(), image.size(), 0);
        const int err = write_sealed(env, fd, image, built.metadata_bytes, kCheckpointFormatVersion);
        sealed = err == 0;
        return err;
      });
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  if (sealed_image) {
    if (!sealed) {  // no write got as far as the header: seal it here
      const unsigned char* payload = image.data() + kUserBlockBytes;
      seal_with(image, kCheckpointFormatVersion,
                checksums_of(payload, image.size() - kUserBlockBytes, built.metadata_bytes));
    }
    sealed_image->assign(reinterpret_cast<const char*>(image.data()), image.size());
  }
  SpareImage::give_back(std::move(image));
  return errors;
}

}  // namespace checkpoint_internal

void save_checkpoint(const std::string& path, const Checkpoint& ckpt, Env* env_given) {
  const std::vector<std::exception_ptr> errors = checkpoint_internal::save_checkpoint_copies({path}, ckpt, env_given);
  if (errors.front()) std::rethrow_exception(errors.front());
}

}  // namespace engine
