#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/io/env.h"
#include "io/read_file.h"

namespace engine {

namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 31;  // as the checkpoint loader (docs/security.md)

std::size_t itemsize(SafeDType t) { return t == SafeDType::F32 ? 4 : 8; }

// Elements of `shape`, or nullopt-like -1 when a dimension is negative or the product
// passes kMaxElements (checked before it can overflow).
int64_t checked_numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (const int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kMaxElements / static_cast<uint64_t>(d)) return -1;
    n *= static_cast<uint64_t>(d);
  }
  return n > kMaxElements ? -1 : static_cast<int64_t>(n);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The JSON text of a value, shortened for a one-line message.
std::string brief(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A name as a message shows it: printable ASCII, others escaped, at most 80 characters.
std::string printable(const std::string& name) {
  std::string out;
  for (const unsigned char c : name) {
    if (out.size() >= 80) return out + "...";
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

const char* to_string(SafeDType t) { return t == SafeDType::F32 ? "F32" : "I64"; }

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::vector<float> SafeTensor::floats() const {
  if (dtype != SafeDType::F32) throw std::logic_error("SafeTensor::floats of a non-F32 tensor");
  std::vector<float> v(bytes.size() / 4);
  // Little-endian bytes into host floats (the engine's hosts are little-endian: x86-64, aarch64).
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

int64_t SafeTensor::scalar_i64() const {
  if (dtype != SafeDType::I64 || bytes.size() != 8) throw std::logic_error("SafeTensor::scalar_i64 of a non-scalar");
  int64_t v;
  std::memcpy(&v, bytes.data(), 8);
  return v;
}

SafeTensor safe_tensor_f32(const std::vector<int64_t>& shape, const float* values) {
  SafeTensor t;
  t.dtype = SafeDType::F32;
  t.shape = shape;
  const int64_t n = checked_numel(shape);
  if (n < 0) throw SafetensorsError("safetensors: shape " + shape_text(shape) + " is too large");
  t.bytes.resize(static_cast<std::size_t>(n) * 4);
  if (n) std::memcpy(t.bytes.data(), values, t.bytes.size());
  return t;
}

SafeTensor safe_tensor_i64_scalar(int64_t value) {
  SafeTensor t;
  t.dtype = SafeDType::I64;
  t.bytes.resize(8);
  std::memcpy(t.bytes.data(), &value, 8);
  return t;
}

std::string encode_safetensors(const SafetensorsContent& content) {
  // The order of the data: larger alignment first, then by name (as the reference
  // implementation writes), so every tensor's bytes are aligned to their item size.
  std::vector<const std::pair<const std::string, SafeTensor>*> order;
  for (const auto& entry : content.tensors) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return itemsize(a->second.dtype) > itemsize(b->second.dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!content.metadata.empty()) header["__metadata__"] = content.metadata;
  uint64_t offset = 0;
  for (const auto* entry : order) {
    const std::string& name = entry->first;
    const SafeTensor& t = entry->second;
    if (name.empty() || name == "__metadata__")
      throw SafetensorsError("safetensors: tensor name '" + name + "' is not allowed");
    const int64_t n = checked_numel(t.shape);
    if (n < 0 || static_cast<uint64_t>(n) * itemsize(t.dtype) != t.bytes.size())
      throw SafetensorsError("safetensors: tensor " + name + " has " + std::to_string(t.bytes.size()) +
                             " bytes for shape " + shape_text(t.shape) + " " + to_string(t.dtype));
    header[name] = {{"dtype", to_string(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  // Spaces up to a multiple of 8, so the data (and every tensor in it) starts aligned.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  for (const auto* entry : order)
    out.append(reinterpret_cast<const char*>(entry->second.bytes.data()), entry->second.bytes.size());
  return out;
}

SafetensorsContent decode_safetensors(const unsigned char* data, std::size_t n, const std::string& origin) {
  const auto fail = [&](const std::string& why) -> SafetensorsError {
    return SafetensorsError(origin + ": " + why);
  };
  if (n < 8) throw fail("truncated: " + std::to_string(n) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kSafetensorsMaxHeaderBytes)
    throw fail("the header length " + std::to_string(header_len) + " exceeds the format's limit of " +
               std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (header_len > n - 8)
    throw fail("truncated: the header length is " + std::to_string(header_len) + " bytes, the file has " +
               std::to_string(n - 8) + " after it");
  if (header_len < 2 || data[8] != '{')
    throw fail("not a safetensors file: the header does not start with '{'");
  const unsigned char* header_begin = data + 8;
  const unsigned char* header_end = header_begin + header_len;
  const uint64_t data_size = n - 8 - header_len;

  // A key twice would let two readers see different files: refused, like the reference.
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each object being parsed
  std::string duplicate;
  const auto on_event = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) open_objects.emplace_back();
    else if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    else if (event == E::key && !open_objects.empty() && duplicate.empty() &&
             !open_objects.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_end, on_event);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (const auto colon = what.find("] "); colon != std::string::npos) what = what.substr(colon + 2);
    throw fail("the header is not valid JSON (" + what + ")");
  }
  if (!duplicate.empty()) throw fail("the header names '" + printable(duplicate) + "' twice");
  if (!header.is_object()) throw fail("the header is not a JSON object");

  SafetensorsContent out;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw fail("__metadata__ value '" + printable(m.key()) + "' is not a string: " + brief(m.value()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string key = "tensor " + printable(name);
    if (name.empty()) throw fail("a tensor has an empty name");
    if (!v.is_object()) throw fail(key + ": not an object");
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        throw fail(key + ": unknown field '" + printable(f.key()) + "'");
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw fail(key + ": needs dtype, shape and data_offsets");
    const nlohmann::json& dt = v["dtype"];
    SafeTensor t;
    if (dt == "F32") t.dtype = SafeDType::F32;
    else if (dt == "I64") t.dtype = SafeDType::I64;
    else throw fail(key + ": dtype " + brief(dt) + " is not supported (F32, I64)");
    const nlohmann::json& shape = v["shape"];
    if (!shape.is_array() || shape.size() > static_cast<std::size_t>(kSafetensorsMaxRank))
      throw fail(key + ": shape " + brief(shape) + " is not an array of at most " +
                 std::to_string(kSafetensorsMaxRank) + " dimensions");
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > kMaxElements)
        throw fail(key + ": shape " + brief(shape) + " has a dimension that is not a whole number in [0, 2^31]");
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    const int64_t numel = checked_numel(t.shape);
    if (numel < 0) throw fail(key + ": shape " + brief(shape) + " has more than 2^31 elements");
    const nlohmann::json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw fail(key + ": data_offsets " + brief(off) + " is not [begin, end] of whole numbers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw fail(key + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] lie outside the " + std::to_string(data_size) + " bytes of data");
    const uint64_t need = static_cast<uint64_t>(numel) * itemsize(t.dtype);
    if (end - begin != need)
      throw fail(key + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
                 std::to_string(end - begin) + " bytes, shape " + shape_text(t.shape) + " " + to_string(t.dtype) +
                 " needs " + std::to_string(need));
    ranges.push_back({begin, end, name});
    out.tensors.emplace(name, std::move(t));
  }
  // The data is exactly the tensors' bytes, each byte belonging to one tensor.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    if (r.begin < covered)
      throw fail("tensor " + printable(r.name) + " overlaps the bytes of another tensor (offset " +
                 std::to_string(r.begin) + ")");
    if (r.begin > covered)
      throw fail("the data has a hole: bytes [" + std::to_string(covered) + ", " + std::to_string(r.begin) +
                 ") belong to no tensor");
    covered = r.end;
  }
  if (covered != data_size)
    throw fail("the data has " + std::to_string(data_size - covered) + " bytes after the last tensor (" +
               std::to_string(data_size) + " bytes, the tensors cover " + std::to_string(covered) + ")");
  // Only now, with every size checked against the bytes present, are the tensors copied.
  const unsigned char* base = header_end;
  for (const Range& r : ranges) {
    SafeTensor& t = out.tensors.at(r.name);
    t.bytes.assign(base + r.begin, base + r.end);
  }
  return out;
}

SafetensorsContent read_safetensors_file(const std::string& path) {
  Env& env = Env::posix();
  FileInfo info;
  if (env.stat(path, info) != 0) throw SafetensorsError(path + ": " + std::strerror(errno));
  if (info.kind != FileKind::Regular) throw SafetensorsError(path + ": not a regular file");
  std::string bytes;
  if (const int err = read_whole_file(env, path, bytes); err != 0)
    throw SafetensorsError(path + ": cannot read (" + std::strerror(err) + ")");
  return decode_safetensors(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), path);
}

}  // namespace engine
