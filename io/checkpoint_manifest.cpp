// Encoding of the parser's manifest: little-endian integers, length-prefixed strings.
#include "io/checkpoint_manifest.h"

#include <cstring>

namespace engine::manifest {

std::size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32: return 4;
    case ElemType::F16: return 2;
    case ElemType::I32: return 4;
    case ElemType::U8: return 1;
    case ElemType::F64: return 8;
  }
  return 0;
}

namespace {

constexpr uint32_t kMagic = 0x4d4e4645;  // "EFNM"
constexpr uint64_t kMaxRank = 32;        // the loader refuses more than 8 with a message

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void f64(double v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    u64(s.size());
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Every read is bounds-checked; the first failure sticks.
class Reader {
 public:
  Reader(const unsigned char* p, std::size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == n_; }
  uint8_t u8() {
    if (!need(1)) return 0;
    return p_[pos_++];
  }
  uint64_t u64() {
    uint64_t v = 0;
    if (!need(8)) return 0;
    std::memcpy(&v, p_ + pos_, 8);
    pos_ += 8;
    return v;
  }
  double f64() {
    double v = 0;
    if (!need(8)) return 0;
    std::memcpy(&v, p_ + pos_, 8);
    pos_ += 8;
    return v;
  }
  std::string str() {
    const uint64_t len = u64();
    if (!need(len)) return {};
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return s;
  }
  // A count of items each taking at least `min_bytes`: never more than what remains.
  uint64_t count(std::size_t min_bytes) {
    const uint64_t c = u64();
    if (ok_ && c > (n_ - pos_) / min_bytes) ok_ = false;
    return ok_ ? c : 0;
  }
  void fail() { ok_ = false; }

 private:
  bool need(uint64_t k) {
    if (!ok_ || k > n_ - pos_) ok_ = false;
    return ok_;
  }
  const unsigned char* p_;
  std::size_t n_, pos_ = 0;
  bool ok_ = true;
};

void put_entry(Writer& w, const Entry& e) {
  w.str(e.key);
  w.str(e.where);
  w.u8(static_cast<uint8_t>(e.kind));
  switch (e.kind) {
    case EntryKind::Int: w.u64(static_cast<uint64_t>(e.int_value)); break;
    case EntryKind::Real: w.f64(e.real_value); break;
    case EntryKind::String: w.str(e.text); break;
    case EntryKind::Tensor:
    case EntryKind::Series:
      w.u8(static_cast<uint8_t>(e.elem));
      w.u8(static_cast<uint8_t>(e.order));
      w.u64(e.dims.size());
      for (uint64_t d : e.dims) w.u64(d);
      w.u8(static_cast<uint8_t>(e.storage));
      if (e.storage == Storage::InFile) {
        w.u64(e.offset);
        w.u64(e.bytes);
      } else if (e.storage == Storage::Inline) {
        w.str(e.inline_bytes);
      }
      break;
  }
}

bool get_entry(Reader& r, Entry& e) {
  e.key = r.str();
  e.where = r.str();
  const uint8_t kind = r.u8();
  if (kind < 1 || kind > 5) return false;
  e.kind = static_cast<EntryKind>(kind);
  switch (e.kind) {
    case EntryKind::Int: e.int_value = static_cast<int64_t>(r.u64()); break;
    case EntryKind::Real: e.real_value = r.f64(); break;
    case EntryKind::String: e.text = r.str(); break;
    case EntryKind::Tensor:
    case EntryKind::Series: {
      const uint8_t elem = r.u8(), order = r.u8();
      if (elem < 1 || elem > 5 || order < 1 || order > 2) return false;
      e.elem = static_cast<ElemType>(elem);
      e.order = static_cast<ByteOrder>(order);
      const uint64_t rank = r.u64();
      if (rank > kMaxRank) return false;
      e.dims.resize(static_cast<std::size_t>(rank));
      for (uint64_t& d : e.dims) d = r.u64();
      const uint8_t storage = r.u8();
      if (storage < 1 || storage > 3) return false;
      e.storage = static_cast<Storage>(storage);
      if (e.storage == Storage::InFile) {
        e.offset = r.u64();
        e.bytes = r.u64();
      } else if (e.storage == Storage::Inline) {
        e.inline_bytes = r.str();
      }
      break;
    }
  }
  return r.ok();
}

}  // namespace

std::string encode(const Manifest& m) {
  Writer w;
  w.u64(kMagic);
  w.u64(m.root_attributes.size());
  for (const Entry& e : m.root_attributes) put_entry(w, e);
  w.u64(m.groups.size());
  for (const Group& g : m.groups) {
    w.str(g.name);
    w.u64(g.entries.size());
    for (const Entry& e : g.entries) put_entry(w, e);
  }
  return w.take();
}

bool decode(const unsigned char* data, std::size_t size, Manifest& out, std::string& why) {
  Reader r(data, size);
  out = Manifest{};
  // An entry takes at least 8 + 8 + 1 + 8 bytes; counts beyond what remains are lies.
  constexpr std::size_t kMinEntry = 25;
  auto bad = [&](const char* what) {
    why = what;
    return false;
  };
  if (r.u64() != kMagic) return bad("the parser's reply does not start with the manifest marker");
  const uint64_t attrs = r.count(kMinEntry);
  for (uint64_t i = 0; i < attrs; ++i) {
    out.root_attributes.emplace_back();
    if (!get_entry(r, out.root_attributes.back())) return bad("the parser's manifest is malformed");
  }
  const uint64_t groups = r.count(16);
  for (uint64_t i = 0; i < groups; ++i) {
    Group& g = out.groups.emplace_back();
    g.name = r.str();
    const uint64_t n = r.count(kMinEntry);
    for (uint64_t j = 0; j < n; ++j) {
      g.entries.emplace_back();
      if (!get_entry(r, g.entries.back())) return bad("the parser's manifest is malformed");
    }
  }
  if (!r.ok() || !r.at_end()) return bad("the parser's manifest is malformed");
  return true;
}

}  // namespace engine::manifest
