// Shared by the checkpoint files: HDF5 datatypes, file-image callbacks, and the rules
// for keys (docs/checkpoint-format.md, section 2).
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"
#include <unistd.h>

#include <atomic>
#include <set>

namespace engine {
namespace checkpoint_internal {
namespace {

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


}  // namespace

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
    case DType::F64: return c.copy_type(H5T_IEEE_F64LE);
  }
  c.fail("unknown tensor dtype");
}

H5Handle memory_type_of(const H5Ctx& c, DType d) {
  switch (d) {
    case DType::F32: return c.copy_type(H5T_NATIVE_FLOAT);
    case DType::F16: return half_type(c, false);
    case DType::I32: return c.copy_type(H5T_NATIVE_INT32);
    case DType::U8: return c.copy_type(H5T_NATIVE_UINT8);
    case DType::F64: return c.copy_type(H5T_NATIVE_DOUBLE);
  }
  c.fail("unknown tensor dtype");
}

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
// Writing the HDF5 image.

std::string unique_image_name(const char* role) {
  static std::atomic<unsigned long> counter{0};
  return std::string("engine-checkpoint-") + role + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

void* image_udata_share(void* udata) { return udata; }
herr_t image_udata_keep(void*) { return 0; }
void* image_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t, void*) {
  if (dest != src) std::memcpy(dest, src, size);
  return dest;
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

}  // namespace checkpoint_internal

using namespace checkpoint_internal;

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

}  // namespace engine
