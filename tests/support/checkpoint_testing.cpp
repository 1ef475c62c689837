#include "support/checkpoint_testing.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include "io/aligned_bytes.h"
#include "io/atomic_file.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"
#include "io/checkpoint_header.h"

namespace engine::checkpoint_testing {

using namespace checkpoint_internal;

namespace {

void write_string_attribute(const H5Ctx& c, hid_t obj, const char* name, const std::string& value) {
  H5Handle type = utf8_string_type(c);
  H5Handle space = c.own(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace");
  H5Handle attr = c.own(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                        std::string("cannot create attribute ") + name);
  const char* text = value.c_str();
  c.ok(H5Awrite(attr.get(), type.get(), &text), std::string("cannot write attribute ") + name);
}

void write_raw(const H5Ctx& c, hid_t root, const RawDataset& raw) {
  const std::size_t slash = raw.path.rfind('/');
  H5Handle parent = c.own(H5Gopen2(root, slash == 0 ? "/" : raw.path.substr(0, slash).c_str(), H5P_DEFAULT),
                          H5Gclose, "cannot open the parent of " + raw.path);
  H5Handle ftype;
  if (raw.type == "float32") ftype = c.copy_type(H5T_IEEE_F32LE);
  else if (raw.type == "float64") ftype = c.copy_type(H5T_IEEE_F64LE);
  else if (raw.type == "int64") ftype = c.copy_type(H5T_STD_I64LE);
  else if (raw.type == "int16") ftype = c.copy_type(H5T_STD_I16LE);
  else if (raw.type == "uint8") ftype = c.copy_type(H5T_STD_U8LE);
  else if (raw.type == "string") ftype = utf8_string_type(c);
  else c.fail("unknown raw dataset type " + raw.type);
  const std::vector<hsize_t> dims(raw.dims.begin(), raw.dims.end());
  H5Handle space;
  if (dims.empty())
    space = c.own(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace");
  else
    space = c.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                  "cannot create the dataspace of " + raw.path);
  // Chunked and never written: HDF5 allocates nothing, so any shape costs nothing.
  // External: contiguous, with its (unwritten) data in another file.
  using Layout = RawDataset::Layout;
  H5Handle dcpl = c.plist(H5P_DATASET_CREATE, "a dataset property list");
  c.ok(H5Pset_obj_track_times(dcpl.get(), 0), "cannot configure datasets");
  const bool has_zero = std::find(dims.begin(), dims.end(), 0) != dims.end();
  if (!raw.external_file.empty()) {
    c.ok(H5Pset_external(dcpl.get(), raw.external_file.c_str(), 0, H5F_UNLIMITED), "cannot set external storage");
  } else if (raw.layout == Layout::Compact) {
    c.ok(H5Pset_layout(dcpl.get(), H5D_COMPACT), "cannot set the compact layout");
  } else if (!dims.empty() && !has_zero) {
    std::vector<hsize_t> chunk(dims.size(), 1);
    if (raw.layout == Layout::FirstChunk) chunk[0] = std::min<hsize_t>(dims[0], 1024);
    if (raw.layout == Layout::Deflated) chunk = dims;
    if (raw.layout == Layout::Chunked) chunk[0] = std::max<hsize_t>(1, dims[0] / 2);
    c.ok(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "cannot set chunking");
    if (raw.layout == Layout::Deflated) c.ok(H5Pset_deflate(dcpl.get(), 6), "cannot set the deflate filter");
  }
  H5Handle dset = c.own(H5Dcreate2(parent.get(), raw.path.substr(slash + 1).c_str(), ftype.get(), space.get(),
                                   H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                        H5Dclose, "cannot create dataset " + raw.path);
  if (raw.external_file.empty() && raw.layout != Layout::Unwritten && raw.type != "string") {
    hsize_t count = 1;
    for (hsize_t d : dims) count *= d;
    if (raw.layout == Layout::FirstChunk) count = std::min<hsize_t>(count, 1024);
    std::vector<double> values(count);
    for (hsize_t i = 0; i < count; ++i) values[i] = static_cast<double>(i % 251);
    H5Handle file_space = c.own(H5Dget_space(dset.get()), H5Sclose, "cannot get the dataspace of " + raw.path);
    H5Handle memory_space = c.own(H5Screate_simple(1, &count, nullptr), H5Sclose, "cannot create a dataspace");
    if (raw.layout == Layout::FirstChunk) {
      const hsize_t start = 0;
      c.ok(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
           "cannot select the first chunk of " + raw.path);
    }
    c.ok(H5Dwrite(dset.get(), H5T_NATIVE_DOUBLE, memory_space.get(), file_space.get(), H5P_DEFAULT, values.data()),
         "cannot write " + raw.path);
  }
  if (raw.series_kind) write_string_attribute(c, dset.get(), "kind", "series");
}

// An ordinary HDF5 file (no engine header) with the checkpoint's groups, empty.
void save_plain_hdf5(const std::string& path, const Checkpoint& ckpt) {
  const H5Ctx c{path};
  H5Handle file = c.own(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                        "cannot create a plain HDF5 file");
  write_string_attribute(c, file.get(), "format", kFormatName);
  for (const auto& [group, d] : ckpt.groups)
    c.own(H5Gcreate2(file.get(), group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
          "cannot create group /" + group);
}

}  // namespace

void save_tampered(const std::string& path, const Checkpoint& ckpt, const Tamper& tamper) {
  if (tamper.plain_hdf5) {
    Hdf5Session session;
    save_plain_hdf5(path, ckpt);
    return;
  }
  save_checkpoint(path, ckpt);
  {
    Hdf5Session session;
    const H5Ctx c{path};
    // HDF5 finds the payload behind the user block by itself.
    H5Handle file = c.own(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "cannot reopen to tamper");
    H5Handle root = c.own(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose, "cannot open the root group");
    if (tamper.format_version != kCheckpointFormatVersion) {
      H5Handle attr = c.own(H5Aopen(root.get(), "format_version", H5P_DEFAULT), H5Aclose, "cannot open /@format_version");
      c.ok(H5Awrite(attr.get(), H5T_NATIVE_INT64, &tamper.format_version), "cannot write /@format_version");
    }
    for (const std::string& group : tamper.omit_groups)
      c.ok(H5Ldelete(root.get(), group.c_str(), H5P_DEFAULT), "cannot delete group /" + group);
    for (const std::string& name : tamper.omit_root_attributes)
      c.ok(H5Adelete(root.get(), name.c_str()), "cannot delete attribute /@" + name);
    for (const RawDataset& raw : tamper.raw_datasets) write_raw(c, root.get(), raw);
  }
  reseal(path, tamper.format_version);
}

void reseal(const std::string& path, int64_t format_version) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open to reseal");
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (content.size() < kUserBlockBytes) fail(path, "too short to reseal");
  Bytes bytes(content.size());
  std::memcpy(bytes.data(), content.data(), content.size());
  seal(bytes, format_version);
  Env& env = Env::posix();
  atomic_write(env, path, [&](int fd) { return write_fully_at(env, fd, bytes.data(), bytes.size(), 0); });
}

}  // namespace engine::checkpoint_testing
