// Private to io/: the checkpoint's HDF5 datatypes, file-image callbacks and key rules
// (implemented in io/checkpoint_hdf5.cpp).
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "engine/io/checkpoint.h"
#include "io/hdf5_plumbing.h"

namespace engine {
namespace checkpoint_internal {

// Datatypes.

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

// Keys.

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

}  // namespace checkpoint_internal
}  // namespace engine
