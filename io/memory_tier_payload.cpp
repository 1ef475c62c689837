// A state in a memory-tier slot's payload, and back (io/memory_tier_slots.h): a JSON index
// of everything but the tensors' bytes, then the tensors, each 64-byte aligned.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/memory_tier_slots.h"
#include "kernels/ops.h"

namespace engine::memory_tier::slots {
namespace {

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Doubles by their bits: JSON has no infinity or NaN, and a resume needs every bit.
nlohmann::json bits_of(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}
double double_of(const nlohmann::json& j) {
  const uint64_t b = j.get<uint64_t>();
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

nlohmann::json scalar_json(const Scalar& s) {
  if (const auto* i = std::get_if<int64_t>(&s)) return {{"int64", *i}};
  if (const auto* d = std::get_if<double>(&s)) return {{"float64", bits_of(*d)}};
  if (const auto* t = std::get_if<std::string>(&s)) return {{"string", *t}};
  nlohmann::json series = nlohmann::json::array();
  for (const double d : std::get<std::vector<double>>(s)) series.push_back(bits_of(d));
  return {{"float64[]", series}};
}

Scalar scalar_of(const nlohmann::json& j) {
  if (!j.is_object() || j.size() != 1) throw std::runtime_error("a scalar is not {kind: value}");
  const auto& [kind, v] = *j.items().begin();
  if (kind == "int64") return v.get<int64_t>();
  if (kind == "float64") return double_of(v);
  if (kind == "string") return v.get<std::string>();
  if (kind == "float64[]") {
    std::vector<double> series;
    for (const auto& e : v) series.push_back(double_of(e));
    return series;
  }
  throw std::runtime_error("unknown scalar kind '" + kind + "'");
}

DType dtype_named(const std::string& name) {
  for (DType t : {DType::F32, DType::F16, DType::I32, DType::U8, DType::F64})
    if (name == dtype_name(t)) return t;
  throw std::runtime_error("unknown dtype '" + name + "'");
}

// The model's and optimizer's tensors are what the step digest covers (io/step_digest.h):
// the optimizer computed it as it wrote them, so the seal need not hash them again. A
// state without a step digest has every byte hashed by the seal.
bool checked_by_step_digest(const Checkpoint& c, const std::string& group) {
  if (group != "model" && group != "optimizer") return false;
  const auto t = c.groups.find("trainer");
  return t != c.groups.end() && t->second.scalars.count("step_digest") != 0;
}

}  // namespace

uint64_t digest_at(const unsigned char* payload, uint64_t at, uint64_t bytes) {
  uint64_t sum = 0;
  kernels::cpu::digest_words(static_cast<int64_t>(bytes / 4), reinterpret_cast<const uint32_t*>(payload + at),
                             static_cast<int64_t>(at / 4), &sum);
  return sum;
}

Layout layout_of(const Checkpoint& c) {
  // The index does not know its own length when the offsets are chosen: the tensors go
  // after a region sized for it, which the index then fits (checked below).
  nlohmann::json groups = nlohmann::json::object();
  Layout l;
  std::size_t count = 0;
  for (const auto& [name, dict] : c.groups) {
    nlohmann::json g = {{"scalars", nlohmann::json::object()}, {"tensors", nlohmann::json::object()}};
    for (const auto& [key, value] : dict.scalars) g["scalars"][key] = scalar_json(value);
    const bool by_step_digest = checked_by_step_digest(c, name);
    for (const auto& [key, t] : dict.tensors) {
      if (!t.device().is_cpu()) throw std::runtime_error(name + "/" + key + " is not on the CPU");
      g["tensors"][key] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"offset", 0},
                           {"bytes", t.nbytes()}, {"checked_by", by_step_digest ? "step_digest" : "seal"}};
      ++count;
    }
    groups[name] = std::move(g);
  }
  nlohmann::json j = {{"meta",
                       {{"format_version", c.meta.format_version},
                        {"engine_version", c.meta.engine_version},
                        {"created_utc", c.meta.created_utc},
                        {"saved_on", c.meta.saved_on}}},
                      {"config_json", c.config_json},
                      {"groups", std::move(groups)}};
  // Offsets: after the index, whose length with the offsets filled in is at most its
  // length now plus 20 digits per tensor.
  const uint64_t reserve = align_up(j.dump().size() + 20 * count + 64);
  uint64_t at = reserve;
  for (auto& [name, dict] : c.groups) {
    const bool by_step_digest = checked_by_step_digest(c, name);
    for (auto& [key, t] : dict.tensors) {
      j["groups"][name]["tensors"][key]["offset"] = at;
      l.tensors.push_back({&t, at, by_step_digest});
      at = align_up(at + t.nbytes());
    }
  }
  l.index = j.dump();
  if (l.index.size() > reserve) throw std::logic_error("memory tier: the index outgrew its region");
  l.payload_bytes = at;
  return l;
}

Checkpoint state_of(const unsigned char* payload, const SlotSeal& seal) {
  const nlohmann::json j = nlohmann::json::parse(payload, payload + seal.index_bytes);
  Checkpoint c;
  const nlohmann::json& m = j.at("meta");
  c.meta.format_version = m.at("format_version").get<int64_t>();
  c.meta.engine_version = m.at("engine_version").get<std::string>();
  c.meta.created_utc = m.at("created_utc").get<std::string>();
  c.meta.saved_on = m.at("saved_on").get<std::string>();
  c.config_json = j.at("config_json").get<std::string>();
  for (const auto& [name, g] : j.at("groups").items()) {
    StateDict& d = c.groups[name];
    for (const auto& [key, s] : g.at("scalars").items()) d.scalars[key] = scalar_of(s);
    for (const auto& [key, t] : g.at("tensors").items()) {
      const DType dtype = dtype_named(t.at("dtype").get<std::string>());
      const Shape shape = t.at("shape").get<Shape>();
      const uint64_t offset = t.at("offset").get<uint64_t>(), bytes = t.at("bytes").get<uint64_t>();
      // The shape's size, checked against the bytes in the payload before anything is
      // allocated: a crafted index cannot ask for more memory than the slot holds.
      uint64_t expected = dtype_size(dtype);
      for (const int64_t e : shape) {
        if (e < 0) throw std::runtime_error(name + "/" + key + ": a negative dimension");
        if (e != 0 && expected > seal.payload_bytes / static_cast<uint64_t>(e)) {
          expected = seal.payload_bytes + 1;  // larger than any payload
          break;
        }
        expected *= static_cast<uint64_t>(e);
      }
      if (bytes != expected || offset < seal.index_bytes || offset > seal.payload_bytes ||
          bytes > seal.payload_bytes - offset)
        throw std::runtime_error(name + "/" + key + ": its bytes do not lie in the payload as its shape says");
      Tensor tensor = Tensor::empty(shape, dtype);
      if (bytes) std::memcpy(tensor.raw(), payload + offset, bytes);
      d.tensors[key] = std::move(tensor);
    }
  }
  return c;
}

uint64_t seal_digest_of(const unsigned char* payload, const SlotSeal& seal, bool& by_step_digest) {
  const nlohmann::json j = nlohmann::json::parse(payload, payload + seal.index_bytes);
  std::vector<std::pair<uint64_t, uint64_t>> skip;
  for (const auto& [name, g] : j.at("groups").items())
    for (const auto& [key, t] : g.at("tensors").items()) {
      if (t.value("checked_by", "seal") != "step_digest") continue;
      const uint64_t offset = t.at("offset").get<uint64_t>(), bytes = t.at("bytes").get<uint64_t>();
      if (offset % 4 || offset < seal.index_bytes || offset > seal.payload_bytes || bytes > seal.payload_bytes - offset)
        throw std::runtime_error(name + "/" + key + ": its bytes do not lie in the payload");
      skip.emplace_back(offset, std::min(seal.payload_bytes, (offset + bytes + 3) / 4 * 4));
    }
  std::sort(skip.begin(), skip.end());
  by_step_digest = !skip.empty();
  uint64_t digest = 0, at = 0;
  for (const auto& [begin, end] : skip) {
    if (begin < at) throw std::runtime_error("tensors overlap in the payload");
    digest += digest_at(payload, at, begin - at);
    at = end;
  }
  return digest + digest_at(payload, at, seal.payload_bytes - at);
}

std::string check_seal(const SlotSeal& s, uint64_t slot_bytes) {
  if (s.sealed == 0 && s.sequence == 0) return "never written";
  if (s.sealed != kSealed) return "torn: its write did not complete (a kill during it)";
  if (s.crc != seal_crc(s)) return "seal checksum mismatch";
  if (s.payload_bytes > slot_bytes - kSealBytes || s.index_bytes > s.payload_bytes)
    return "its payload (" + std::to_string(s.payload_bytes) + " bytes) does not fit its slot";
  return "";
}

}  // namespace engine::memory_tier::slots
