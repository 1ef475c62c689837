// The loader's side of the parse: the manifest may come from a parser process that the
// file subverted, so it is checked here as if written by an attacker.
#include "io/checkpoint_assemble.h"

#include "io/aligned_bytes.h"
#include "io/checkpoint_format.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <vector>

namespace engine {

namespace {

using manifest::ByteOrder;
using manifest::ElemType;
using manifest::Entry;
using manifest::EntryKind;
using manifest::Storage;

// Limits and names shared with the writer and the parser.
using checkpoint_internal::kFormatName;
using checkpoint_internal::kMaxElements;
using checkpoint_internal::kMaxRank;
using checkpoint_internal::kRootAttributes;
using checkpoint_internal::kUserBlockBytes;

[[noreturn]] void fail(const std::string& path, const std::string& msg) { throw CheckpointError(path + ": " + msg); }
std::string corrupt(const std::string& detail) { return "checksum mismatch (file is corrupt): " + detail; }

// Names from the file end up in messages: one line, bounded.
std::string printable(const std::string& s) {
  std::string out = s.substr(0, 500);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

bool valid_key(const std::string& key) {
  if (key.empty() || key.size() > 4096) return false;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = key.find('/', start);
    const std::string part = key.substr(start, slash - start);
    if (part.empty() || part == "." || part.find('\0') != std::string::npos) return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

DType dtype_of(ElemType e) {
  switch (e) {
    case ElemType::F16: return DType::F16;
    case ElemType::I32: return DType::I32;
    case ElemType::U8: return DType::U8;
    default: return DType::F32;
  }
}

void copy_swapped(unsigned char* dst, const unsigned char* src, std::size_t bytes, std::size_t width) {
  for (std::size_t i = 0; i + width <= bytes; i += width)
    for (std::size_t b = 0; b < width; ++b) dst[i + b] = src[i + width - 1 - b];
}

class Assembler {
 public:
  Assembler(const std::string& path, const std::shared_ptr<void>& owner, unsigned char* file, std::size_t size)
      : path_(path), owner_(owner), file_(file), size_(size) {}

  Scalar scalar(const Entry& e) {
    switch (e.kind) {
      case EntryKind::Int: return e.int_value;
      case EntryKind::Real: return e.real_value;
      case EntryKind::String: return e.text;
      default: fail(path_, printable(e.where) + " is not a scalar");
    }
  }

  void add(const Entry& e, StateDict& out) {
    const std::string where = printable(e.where);
    if (!valid_key(e.key)) fail(path_, where + " has an invalid key");
    if (out.tensors.count(e.key) || out.scalars.count(e.key)) fail(path_, where + " repeats key '" + printable(e.key) + "'");
    if (e.kind != EntryKind::Tensor && e.kind != EntryKind::Series) {
      out.scalars.emplace(e.key, scalar(e));
      return;
    }
    if (e.dims.size() > static_cast<std::size_t>(kMaxRank))
      fail(path_, where + " has rank " + std::to_string(e.dims.size()) + " (at most 8)");
    uint64_t numel = 1;
    for (uint64_t d : e.dims)
      if (d > kMaxElements || (numel *= d) > kMaxElements) fail(path_, where + " has more than 2^31 elements");
    const std::size_t width = manifest::elem_size(e.elem);
    const std::size_t nbytes = static_cast<std::size_t>(numel) * width;
    const bool series = e.kind == EntryKind::Series;
    if (series != (e.elem == ElemType::F64) || (series && e.dims.size() != 1))
      fail(path_, where + " has a type or shape the manifest may not give it");
    const unsigned char* src = stored_bytes(e, where, nbytes);

    if (series) {
      std::vector<double> values(static_cast<std::size_t>(numel));
      charge(nbytes, where);
      if (nbytes > 0) place(reinterpret_cast<unsigned char*>(values.data()), src, nbytes, width, e.order);
      out.scalars.emplace(e.key, std::move(values));
      return;
    }
    const Shape shape(e.dims.begin(), e.dims.end());
    const DType dtype = dtype_of(e.elem);
    if (e.storage == Storage::InFile && e.order == ByteOrder::Little &&
        reinterpret_cast<std::uintptr_t>(src) % 64 == 0) {
      out.tensors.emplace(e.key, Tensor::wrap_host(owner_, const_cast<unsigned char*>(src), shape, dtype));
      return;
    }
    charge(nbytes, where);
    Tensor t = Tensor::empty(shape, dtype, Device::cpu());
    if (nbytes > 0) place(static_cast<unsigned char*>(t.raw()), src, nbytes, width, e.order);
    out.tensors.emplace(e.key, std::move(t));
  }

  // Datasets' stored bytes never overlap in a file HDF5 wrote; a crafted one that does
  // would make two loaded tensors share memory.
  void check_disjoint() {
    std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
    for (std::size_t i = 1; i < ranges_.size(); ++i)
      if (ranges_[i].offset < ranges_[i - 1].offset + ranges_[i - 1].bytes)
        fail(path_, corrupt(ranges_[i - 1].where + " and " + ranges_[i].where + " share stored bytes"));
  }

 private:
  const unsigned char* stored_bytes(const Entry& e, const std::string& where, std::size_t nbytes) {
    switch (e.storage) {
      case Storage::None:
        if (nbytes != 0) fail(path_, where + " has no stored data");
        return nullptr;
      case Storage::InFile:
        if (e.bytes != nbytes)
          fail(path_, corrupt(where + " stores " + std::to_string(e.bytes) + " bytes, its shape and type need " +
                              std::to_string(nbytes)));
        if (e.offset < kUserBlockBytes || e.offset > size_ || nbytes > size_ - e.offset)
          fail(path_, corrupt(where + " has its data outside the file"));
        if (nbytes > 0) ranges_.push_back(Range{e.offset, nbytes, where});
        return file_ + e.offset;
      case Storage::Inline:
        if (e.inline_bytes.size() != nbytes)
          fail(path_, corrupt(where + " stores " + std::to_string(e.inline_bytes.size()) +
                              " bytes, its shape and type need " + std::to_string(nbytes)));
        return reinterpret_cast<const unsigned char*>(e.inline_bytes.data());
    }
    fail(path_, where + " has no stored data");
  }

  // Every copy is paid from a budget of the file's own size: copies come from stored
  // bytes that are disjoint (checked) or from the manifest (bounded by the parser's
  // reply), so an honest file never exceeds it.
  void charge(std::size_t bytes, const std::string& where) {
    if (bytes > budget_) fail(path_, where + " would take more memory than the file's size justifies");
    budget_ -= bytes;
  }

  static void place(unsigned char* dst, const unsigned char* src, std::size_t bytes, std::size_t width, ByteOrder order) {
    if (order == ByteOrder::Little || width == 1) std::memcpy(dst, src, bytes);
    else copy_swapped(dst, src, bytes, width);
  }

  struct Range {
    uint64_t offset;
    std::size_t bytes;
    std::string where;
  };
  const std::string& path_;
  const std::shared_ptr<void>& owner_;
  unsigned char* file_;
  std::size_t size_;
  std::size_t budget_ = size_ + (std::size_t(1) << 20);
  std::vector<Range> ranges_;
};

std::string require_string(const std::string& path, const Scalar& s, const char* name) {
  if (auto p = std::get_if<std::string>(&s)) return *p;
  fail(path, std::string("root attribute ") + name + " is " + scalar_kind(s) + ", expected string");
}

}  // namespace

Checkpoint assemble_checkpoint(const std::string& path, const manifest::Manifest& m, const std::shared_ptr<void>& owner,
                               unsigned char* file, std::size_t size, int64_t header_version) {
  Assembler a(path, owner, file, size);
  std::map<std::string, Scalar> attrs;
  for (const Entry& e : m.root_attributes) attrs.emplace(e.key, a.scalar(e));
  for (const char* name : kRootAttributes)
    if (!attrs.count(name)) fail(path, std::string("missing root attribute '") + name + "'");
  const std::string format = require_string(path, attrs["format"], "format");
  if (format != kFormatName)
    fail(path, "root attribute format is '" + printable(format) + "', expected '" + kFormatName + "'");
  const int64_t* version = std::get_if<int64_t>(&attrs["format_version"]);
  if (!version) fail(path, "root attribute format_version is not an int64");
  if (*version != header_version)
    fail(path, corrupt("format_version is " + std::to_string(header_version) + " in the header but " +
                       std::to_string(*version) + " in the root attribute"));

  Checkpoint ckpt;
  ckpt.meta.format_version = *version;
  ckpt.meta.engine_version = require_string(path, attrs["engine_version"], "engine_version");
  ckpt.meta.created_utc = require_string(path, attrs["created_utc"], "created_utc");
  ckpt.meta.saved_on = require_string(path, attrs["saved_on"], "saved_on");
  ckpt.config_json = require_string(path, attrs["config"], "config");

  for (const manifest::Group& g : m.groups) {
    if (g.name.empty() || g.name.find('/') != std::string::npos || !valid_key(g.name))
      fail(path, "a group at the root has an invalid name");
    auto [it, fresh] = ckpt.groups.emplace(g.name, StateDict{});
    if (!fresh) fail(path, "group /" + printable(g.name) + " appears twice");
    for (const Entry& e : g.entries) a.add(e, it->second);
  }
  for (const std::string& g : checkpoint_required_groups())
    if (!ckpt.groups.count(g)) fail(path, "missing group /" + g);
  a.check_disjoint();
  return ckpt;
}

}  // namespace engine
