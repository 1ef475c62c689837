// Walks an HDF5 checkpoint image into a manifest. This is the only code that lets
// libhdf5 parse a file being loaded, and it runs in the sandboxed parser process.
// Checks here give the precise messages; the loader repeats every check that matters
// for memory safety, since this process may have been subverted by the file.
#include "io/hdf5_walk.h"

#include "io/aligned_bytes.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"

#include <hdf5.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace engine::hdf5_walk {

namespace {

using manifest::ByteOrder;
using manifest::ElemType;
using manifest::Entry;
using manifest::EntryKind;
using manifest::Storage;

// Limits and names shared with the writer and the loader.
using checkpoint_internal::kMaxElements;
using checkpoint_internal::kMaxRank;
using checkpoint_internal::kRootAttributes;
using checkpoint_internal::kUserBlockBytes;
using checkpoint_internal::kMaxNesting;
// HDF5 keeps compact data inside the object header, which is at most 64 KiB.
constexpr std::size_t kMaxCompactBytes = std::size_t(64) << 10;
const char* const kRequiredGroups[] = {"model", "optimizer", "scheduler", "scaler", "rng", "trainer", "metrics"};

[[noreturn]] void refuse(const std::string& msg) { throw Refusal(msg); }

std::string corrupt(const std::string& detail) { return "file is corrupt: " + detail; }

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

using Handle = checkpoint_internal::H5Handle;

Handle own(hid_t id, Handle::Closer close, const std::string& what) {
  if (id < 0) refuse(what + hdf5_reason());
  return Handle(id, close);
}
void ok(herr_t r, const std::string& what) {
  if (r < 0) refuse(what + hdf5_reason());
}

// File-image callbacks that lend HDF5 the buffer instead of copying it.
struct LentImage {
  void* data;
  std::size_t size;
};
void* lent_malloc(std::size_t size, H5FD_file_image_op_t, void* udata) {
  auto* img = static_cast<LentImage*>(udata);
  return size == img->size ? img->data : nullptr;
}
void* lent_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t, void*) {
  if (dest != src) std::memcpy(dest, src, size);
  return dest;
}
void* lent_realloc(void*, std::size_t, H5FD_file_image_op_t, void*) { return nullptr; }
herr_t lent_free(void*, H5FD_file_image_op_t, void*) { return 0; }
void* lent_share(void* udata) { return udata; }
herr_t lent_keep(void*) { return 0; }

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
herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  try {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

struct Child {
  Handle handle;
  H5O_type_t type = H5O_TYPE_UNKNOWN;
  hsize_t num_attrs = 0;
};

bool type_equals(hid_t a, hid_t b) { return H5Tequal(a, b) > 0; }

using checkpoint_internal::describe_type;  // "float32", "int64", "vlen", ... for messages

Handle half_type(bool big_endian) {
  Handle t = own(H5Tcopy(big_endian ? H5T_IEEE_F32BE : H5T_IEEE_F32LE), H5Tclose, "cannot copy an HDF5 datatype");
  ok(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "cannot define the float16 type");
  ok(H5Tset_size(t.get(), 2), "cannot define the float16 type");
  ok(H5Tset_ebias(t.get(), 15), "cannot define the float16 type");
  return t;
}

// The native (little-endian) memory type HDF5 converts into when it reads data itself.
hid_t native_type_of(ElemType e, hid_t half_le) {
  switch (e) {
    case ElemType::F32: return H5T_NATIVE_FLOAT;
    case ElemType::F16: return half_le;
    case ElemType::I32: return H5T_NATIVE_INT32;
    case ElemType::U8: return H5T_NATIVE_UINT8;
    case ElemType::F64: return H5T_NATIVE_DOUBLE;
  }
  return -1;
}

class Walker {
 public:
  Walker(std::size_t image_size, ImageContent content)
      : image_size_(image_size), content_(content), half_le_(half_type(false)), half_be_(half_type(true)) {}

  Entry read_attribute(hid_t obj, const std::string& name, const std::string& key, const std::string& where) {
    Handle attr = own(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "cannot open attribute " + where);
    Handle space = own(H5Aget_space(attr.get()), H5Sclose, "cannot read attribute " + where);
    if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
      refuse("attribute " + where + " is not a single value (only scalar attributes are allowed)");
    Handle ftype = own(H5Aget_type(attr.get()), H5Tclose, "cannot read attribute " + where);
    const H5T_class_t cls = H5Tget_class(ftype.get());
    const std::size_t size = H5Tget_size(ftype.get());
    Entry e;
    e.key = key;
    e.where = where;
    if (cls == H5T_INTEGER && (size < 8 || H5Tget_sign(ftype.get()) == H5T_SGN_2)) {
      e.kind = EntryKind::Int;
      ok(H5Aread(attr.get(), H5T_NATIVE_INT64, &e.int_value), "cannot read attribute " + where);
      return e;
    }
    if (cls == H5T_FLOAT && (type_equals(ftype.get(), H5T_IEEE_F64LE) || type_equals(ftype.get(), H5T_IEEE_F64BE) ||
                             type_equals(ftype.get(), H5T_IEEE_F32LE) || type_equals(ftype.get(), H5T_IEEE_F32BE))) {
      e.kind = EntryKind::Real;
      ok(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &e.real_value), "cannot read attribute " + where);
      return e;
    }
    if (cls == H5T_STRING) {
      e.kind = EntryKind::String;
      e.text = read_string(attr.get(), ftype.get(), where);
      return e;
    }
    refuse("attribute " + where + " has unsupported type " + describe_type(ftype.get()) +
           " (supported: int64, float64, string)");
  }

  std::string read_string(hid_t attr, hid_t ftype, const std::string& where) {
    Handle mtype = own(H5Tget_native_type(ftype, H5T_DIR_DEFAULT), H5Tclose, "cannot read string " + where);
    const htri_t variable = H5Tis_variable_str(ftype);
    ok(variable, "cannot read string " + where);
    if (variable > 0) {
      char* p = nullptr;
      ok(H5Aread(attr, mtype.get(), &p), "cannot read string " + where);
      std::string s = p ? p : "";
      H5free_memory(p);
      return s;
    }
    const std::size_t size = H5Tget_size(ftype);
    if (size > image_size_) refuse("string " + where + " is longer than the file");
    std::string s(size, '\0');
    ok(H5Aread(attr, mtype.get(), s.data()), "cannot read string " + where);
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  std::vector<std::string> attribute_names(hid_t obj, const std::string& where) {
    std::vector<std::string> names;
    ok(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute_name, &names),
       "cannot list the attributes of " + where);
    return names;
  }

  std::vector<LinkEntry> links(hid_t g, const std::string& where) {
    std::vector<LinkEntry> out;
    ok(ENGINE_H5_LITERATE(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_link, &out),
       "cannot list group " + (where.empty() ? std::string("/") : where));
    return out;
  }

  // Soft and external links could point anywhere (other files included), and an object
  // linked twice could make the walk loop.
  Child open_child(hid_t g, const LinkEntry& link, const std::string& at) {
    if (link.type != H5L_TYPE_HARD) refuse(at + " is a soft or external link (only plain objects are allowed)");
    Child child;
    child.handle = own(open_object_at(g, link.location), H5Oclose, "cannot open " + at);
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t oinfo{};
    ok(H5Oget_info3(child.handle.get(), &oinfo, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS), "cannot inspect " + at);
#else
    H5O_info_t oinfo{};
    ok(H5Oget_info2(child.handle.get(), &oinfo, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS), "cannot inspect " + at);
#endif
    if (oinfo.rc != 1) refuse(at + " is linked more than once");
    if (oinfo.type != H5O_TYPE_GROUP && oinfo.type != H5O_TYPE_DATASET) refuse(at + " is neither a group nor a dataset");
    child.type = oinfo.type;
    child.num_attrs = oinfo.num_attrs;
    return child;
  }

  void read_group(hid_t g, hsize_t num_attrs, const std::string& where, const std::string& prefix,
                  std::vector<Entry>& out, std::set<std::string>& keys, int depth) {
    if (depth > kMaxNesting) refuse("groups below " + where + " are nested more than 16 deep");
    if (num_attrs > 0)
      for (const std::string& name : attribute_names(g, where)) {
        const std::string key = prefix + name;
        out.push_back(read_attribute(g, name, key, where + "@" + name));
        keys.insert(key);
      }
    for (const LinkEntry& link : links(g, where)) {
      const std::string at = where + "/" + link.name;
      Child child = open_child(g, link, at);
      const std::string key = prefix + link.name;
      if (child.type == H5O_TYPE_GROUP)
        read_group(child.handle.get(), child.num_attrs, at, key + "/", out, keys, depth + 1);
      else
        read_dataset(child.handle.get(), child.num_attrs, at, key, out, keys);
    }
  }

  void read_dataset(hid_t d, hsize_t num_attrs, const std::string& at, const std::string& key, std::vector<Entry>& out,
                    std::set<std::string>& keys) {
    bool series = false;
    if (num_attrs > 0) {
      const htri_t has_kind = H5Aexists(d, "kind");
      ok(has_kind, "cannot read " + at);
      if (has_kind > 0) {
        const Entry kind = read_attribute(d, "kind", "kind", at + "@kind");
        if (kind.kind != EntryKind::String || kind.text != "series")
          refuse(at + " has an unknown kind attribute (only \"series\" is defined)");
        series = true;
      }
    }
    Entry e;
    e.key = key;
    e.where = at;
    e.kind = series ? EntryKind::Series : EntryKind::Tensor;
    e.dims = read_shape(d, at);
    Handle ftype = own(H5Dget_type(d), H5Tclose, "cannot read the type of " + at);
    if (series) {
      if (!type_equals(ftype.get(), H5T_IEEE_F64LE) && !type_equals(ftype.get(), H5T_IEEE_F64BE))
        refuse(at + " is a series of " + describe_type(ftype.get()) + " (series are float64)");
      if (e.dims.size() != 1) refuse(at + " is a series of rank " + std::to_string(e.dims.size()) + " (series are 1-D)");
      e.elem = ElemType::F64;
      e.order = type_equals(ftype.get(), H5T_IEEE_F64LE) ? ByteOrder::Little : ByteOrder::Big;
    } else if (!tensor_type(ftype.get(), e)) {
      refuse(at + " has unsupported dtype " + describe_type(ftype.get()) + " (supported: float32, float16, int32, uint8)");
    }
    if (!keys.insert(key).second) refuse(at + " repeats key '" + key + "'");
    uint64_t numel = 1;
    for (uint64_t dim : e.dims) numel *= dim;  // each <= 2^31, product <= 2^31 (read_shape)
    locate(d, at, numel * manifest::elem_size(e.elem), e);
    out.push_back(std::move(e));
  }

  // The shape, refused if absurd before anything is allocated for it.
  std::vector<uint64_t> read_shape(hid_t d, const std::string& at) {
    Handle space = own(H5Dget_space(d), H5Sclose, "cannot read the shape of " + at);
    hsize_t dims[H5S_MAX_RANK] = {};
    const int rank = H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    if (rank < 0) refuse("cannot read the shape of " + at + hdf5_reason());
    if (rank == 0) {
      if (H5Sget_simple_extent_type(space.get()) == H5S_SCALAR) return {};
      refuse(at + " has no shape (null dataspace)");
    }
    if (rank > kMaxRank) refuse(at + " has rank " + std::to_string(rank) + " (at most 8)");
    uint64_t total = 1;
    for (int i = 0; i < rank; ++i) {
      if (dims[i] > kMaxElements || (total *= dims[i]) > kMaxElements) {
        std::string text = "[";
        for (int j = 0; j < rank; ++j) text += (j ? ", " : "") + std::to_string(dims[j]);
        refuse(at + " has shape " + text + "], more than 2^31 elements");
      }
    }
    return std::vector<uint64_t>(dims, dims + rank);
  }

  bool tensor_type(hid_t ftype, Entry& e) {
    const H5T_class_t cls = H5Tget_class(ftype);
    const std::size_t size = H5Tget_size(ftype);
    if (cls == H5T_FLOAT && size == 4 && type_equals(ftype, H5T_IEEE_F32LE)) {
      e.elem = ElemType::F32;
      e.order = ByteOrder::Little;
    } else if (cls == H5T_FLOAT && size == 4 && type_equals(ftype, H5T_IEEE_F32BE)) {
      e.elem = ElemType::F32;
      e.order = ByteOrder::Big;
    } else if (cls == H5T_FLOAT && size == 2 && type_equals(ftype, half_le_.get())) {
      e.elem = ElemType::F16;
      e.order = ByteOrder::Little;
    } else if (cls == H5T_FLOAT && size == 2 && type_equals(ftype, half_be_.get())) {
      e.elem = ElemType::F16;
      e.order = ByteOrder::Big;
    } else if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(ftype) == H5T_SGN_2) {
      e.elem = ElemType::I32;
      e.order = H5Tget_order(ftype) == H5T_ORDER_BE ? ByteOrder::Big : ByteOrder::Little;
    } else if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(ftype) == H5T_SGN_NONE) {
      e.elem = ElemType::U8;
      e.order = ByteOrder::Little;
    } else {
      return false;
    }
    return true;
  }

  // Where the dataset's bytes are. Only bytes that are stored count: data kept in
  // external files, never written (fill values), partly written, or filtered (which
  // could decode to any size) is refused, so no dataset can make the loader allocate
  // more than the file holds.
  void locate(hid_t d, const std::string& at, uint64_t nbytes, Entry& e) {
    Handle dcpl = own(H5Dget_create_plist(d), H5Pclose, "cannot read the layout of " + at);
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
      refuse(at + " has an unsupported storage layout (virtual or unknown)");
    if (H5Pget_external_count(dcpl.get()) != 0) refuse(at + " keeps its data in external files");
    if (nbytes == 0) {
      e.storage = Storage::None;
      return;
    }
    const hsize_t stored = H5Dget_storage_size(d);
    if (layout == H5D_CONTIGUOUS) {
      const haddr_t offset = H5Dget_offset(d);
      if (offset == HADDR_UNDEF) refuse(at + " has no stored data");
      if (stored != nbytes)
        refuse(corrupt(at + " stores " + std::to_string(stored) + " bytes, its shape and type need " +
                       std::to_string(nbytes)));
      if (offset < kUserBlockBytes || offset > image_size_ || nbytes > image_size_ - offset)
        refuse(corrupt(at + " has its data outside the file"));
      e.storage = Storage::InFile;
      e.offset = offset;
      e.bytes = nbytes;
      return;
    }
    if (layout == H5D_COMPACT) {
      if (stored != nbytes || nbytes > kMaxCompactBytes)
        refuse(corrupt(at + " stores " + std::to_string(stored) + " bytes, its shape and type need " +
                       std::to_string(nbytes)));
    } else {
      if (H5Pget_nfilters(dcpl.get()) != 0)
        refuse(at + " is compressed or filtered (only data stored as is can be loaded)");
      H5D_space_status_t status{};
      ok(H5Dget_space_status(d, &status), "cannot read " + at);
      if (status == H5D_SPACE_STATUS_NOT_ALLOCATED) refuse(at + " has no stored data");
      if (status != H5D_SPACE_STATUS_ALLOCATED)
        refuse(at + " is only partly stored (missing chunks would read as fill values)");
      if (stored < nbytes || stored > image_size_)
        refuse(corrupt(at + " stores " + std::to_string(stored) + " bytes, its shape and type need " +
                       std::to_string(nbytes)));
      if (content_ != ImageContent::Complete) throw NeedsData{};
    }
    e.storage = Storage::Inline;
    e.inline_bytes.assign(static_cast<std::size_t>(nbytes), '\0');
    e.order = ByteOrder::Little;  // HDF5 converts while reading
    ok(H5Dread(d, native_type_of(e.elem, half_le_.get()), H5S_ALL, H5S_ALL, H5P_DEFAULT, e.inline_bytes.data()),
       "cannot read " + at);
  }

 private:
  std::size_t image_size_;
  ImageContent content_;
  Handle half_le_, half_be_;
};

}  // namespace

manifest::Manifest walk(unsigned char* image, std::size_t size, ImageContent content) {
  H5open();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  H5PLset_loading_state(0);  // a file must not make the parser load code
  Handle fapl = own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access property list");
  ok(H5Pset_fapl_core(fapl.get(), std::size_t(4) << 20, 0), "cannot select the in-memory driver");
  LentImage lent{image, size};
  H5FD_file_image_callbacks_t callbacks = {lent_malloc, lent_memcpy, lent_realloc, lent_free,
                                           lent_share,  lent_keep,   &lent};
  ok(H5Pset_file_image_callbacks(fapl.get(), &callbacks), "cannot set the file image callbacks");
  ok(H5Pset_file_image(fapl.get(), image, size), "cannot hand the file image to HDF5");
  Handle file = own(H5Fopen("engine-checkpoint-parse", H5F_ACC_RDONLY, fapl.get()), H5Fclose,
                    "not a readable HDF5 file");
  Walker w(size, content);
  Handle root = own(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose, "cannot open the root group");
  manifest::Manifest m;
  for (const char* name : kRootAttributes) {
    const htri_t exists = H5Aexists(root.get(), name);
    ok(exists, std::string("cannot read root attribute ") + name);
    if (exists == 0) refuse(std::string("missing root attribute '") + name + "'");
    m.root_attributes.push_back(w.read_attribute(root.get(), name, name, std::string("/@") + name));
  }
  for (const char* g : kRequiredGroups) {
    const htri_t exists = H5Lexists(root.get(), g, H5P_DEFAULT);
    ok(exists, std::string("cannot look up group /") + g);
    if (exists == 0) refuse(std::string("missing group /") + g);
  }
  for (const LinkEntry& link : w.links(root.get(), "")) {
    const std::string at = "/" + link.name;
    Child child = w.open_child(root.get(), link, at);
    if (child.type != H5O_TYPE_GROUP) refuse(at + " is not a group (only groups belong at the root)");
    manifest::Group& g = m.groups.emplace_back();
    g.name = link.name;
    std::set<std::string> keys;
    w.read_group(child.handle.get(), child.num_attrs, at, "", g.entries, keys, 1);
  }
  return m;
}

}  // namespace engine::hdf5_walk
