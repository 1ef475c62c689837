// The checkpoint tools behind `engine verify`, `engine inspect` and `engine diff`.
#include "engine/io/step_digest.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_hdf5.h"
#include "io/checkpoint_reader.h"
#include "io/number_text.h"

#include <algorithm>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace engine {
namespace checkpoint_internal {
namespace {

// ---------------------------------------------------------------------------------
// Inspect and diff.

double half_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(man, -24);
  else if (exp == 31) v = man ? std::nan("") : INFINITY;
  else v = std::ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.f32()[i];
    case DType::F16: return half_to_double(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::I32: return t.i32()[i];
    case DType::U8: return t.u8()[i];
    case DType::F64: return t.f64()[i];
  }
  return 0;
}

double l2_norm(const Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = element(t, i);
    sum += x * x;
  }
  return std::sqrt(sum);
}

std::string scalar_text(const Scalar& s) {
  if (auto i = std::get_if<int64_t>(&s)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&s)) return fmt_double(*d);
  if (auto str = std::get_if<std::string>(&s)) return "\"" + *str + "\"";
  const auto& v = std::get<std::vector<double>>(s);
  return std::to_string(v.size()) + " values" + (v.empty() ? "" : ", last " + fmt_double(v.back()));
}

// Required groups in their documented order, then any others.
std::vector<std::string> group_order(const std::set<std::string>& present) {
  std::vector<std::string> order;
  for (const std::string& g : checkpoint_required_groups())
    if (present.count(g)) order.push_back(g);
  for (const std::string& g : present)
    if (std::find(order.begin(), order.end(), g) == order.end()) order.push_back(g);
  return order;
}

std::set<std::string> group_names(const Checkpoint& c) {
  std::set<std::string> s;
  for (const auto& kv : c.groups) s.insert(kv.first);
  return s;
}

bool same_bits(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// "identical", or what differs; sets `differs`.
std::string compare_tensors(const Tensor& a, const Tensor& b, bool& differs) {
  differs = true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return std::string("mismatch: ") + dtype_name(a.dtype()) + shape_str(a.shape()) + " vs " + dtype_name(b.dtype()) +
           shape_str(b.shape());
  if (same_bits(a.raw(), b.raw(), a.nbytes())) {
    differs = false;
    return "identical";
  }
  const std::size_t esize = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.raw());
  const auto* pb = static_cast<const unsigned char*>(b.raw());
  double largest = 0;
  int64_t count = 0, nan_mismatch = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (same_bits(pa + i * esize, pb + i * esize, esize)) continue;
    ++count;  // includes 0.0 vs -0.0 and NaNs with different payloads
    const double x = element(a, i), y = element(b, i);
    if (std::isnan(x) || std::isnan(y)) ++nan_mismatch;
    else largest = std::max(largest, std::fabs(x - y));
  }
  std::string text = "max abs diff " + fmt_short(largest) + " (" + std::to_string(count) + " of " +
                     std::to_string(a.numel()) + " elements differ";
  if (nan_mismatch) text += ", " + std::to_string(nan_mismatch) + " involve NaN";
  return text + ")";
}

std::string compare_scalars(const Scalar& a, const Scalar& b, bool& differs) {
  differs = true;
  if (a.index() != b.index()) return std::string("mismatch: ") + scalar_kind(a) + " vs " + scalar_kind(b);
  if (auto x = std::get_if<int64_t>(&a)) {
    const int64_t y = std::get<int64_t>(b);
    if (*x == y) return differs = false, "identical";
    return std::to_string(*x) + " vs " + std::to_string(y);
  }
  if (auto x = std::get_if<double>(&a)) {
    const double y = std::get<double>(b);
    if (same_bits(x, &y, sizeof y)) return differs = false, "identical";
    return fmt_double(*x) + " vs " + fmt_double(y) + " (abs diff " + fmt_short(std::fabs(*x - y)) + ")";
  }
  if (auto x = std::get_if<std::string>(&a)) {
    if (*x == std::get<std::string>(b)) return differs = false, "identical";
    return "\"" + *x + "\" vs \"" + std::get<std::string>(b) + "\"";
  }
  const auto& va = std::get<std::vector<double>>(a);
  const auto& vb = std::get<std::vector<double>>(b);
  if (va.size() != vb.size())
    return "series length " + std::to_string(va.size()) + " vs " + std::to_string(vb.size());
  if (same_bits(va.data(), vb.data(), va.size() * sizeof(double))) return differs = false, "identical";
  double largest = 0;
  for (std::size_t i = 0; i < va.size(); ++i)
    if (!std::isnan(va[i]) && !std::isnan(vb[i])) largest = std::max(largest, std::fabs(va[i] - vb[i]));
  return "series max abs diff " + fmt_short(largest);
}

// Wall-clock measurements (metrics series and trainer scalars named *_seconds) differ between runs with the
// same state, so diff lists them without counting them.
bool is_wall_clock(const std::string& group, const std::string& key) {
  const std::string suffix = "_seconds";
  return (group == "metrics" || group == "trainer") && key.size() > suffix.size() &&
         key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void flatten_json(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items()) flatten_json(value, prefix.empty() ? key : prefix + "." + key, out);
  } else {
    out[prefix] = j.dump();
  }
}

// "differs at a.b (x vs y), c.d (...)" naming the dotted keys, or "differs" for non-JSON.
std::string config_difference(const std::string& a, const std::string& b) {
  std::map<std::string, std::string> fa, fb;
  try {
    flatten_json(nlohmann::json::parse(a), "", fa);
    flatten_json(nlohmann::json::parse(b), "", fb);
  } catch (const std::exception&) {
    return "differs";
  }
  std::set<std::string> keys;
  for (const auto& kv : fa) keys.insert(kv.first);
  for (const auto& kv : fb) keys.insert(kv.first);
  std::string text;
  int shown = 0, total = 0;
  for (const std::string& key : keys) {
    const auto ia = fa.find(key), ib = fb.find(key);
    const std::string va = ia == fa.end() ? "absent" : ia->second, vb = ib == fb.end() ? "absent" : ib->second;
    if (va == vb) continue;
    if (++total > 8) continue;
    text += std::string(shown++ ? ", " : "") + key + " (" + va + " vs " + vb + ")";
  }
  if (total > shown) text += ", and " + std::to_string(total - shown) + " more";
  return total ? "differs at " + text : "differs only in formatting";
}

}  // namespace
}  // namespace checkpoint_internal

using namespace checkpoint_internal;

void verify_checkpoint_file(const std::string& path, Env* env) {
  const Checkpoint ck = load_checkpoint(path, env);
  // The digest the training recorded for this step against what the stored tensors give:
  // a file changed after the training computed it (and sealed again) fails here. A file
  // that is no trainer's (a host's own groups) carries none.
  auto trainer = ck.groups.find("trainer");
  if (trainer == ck.groups.end() || !trainer->second.scalars.count("step_digest")) return;
  const uint64_t stored = stored_step_digest(ck, path), computed = step_digest_of(ck, path).combined();
  if (stored != computed)
    throw CheckpointError(path + ": its tensors give step digest " + digest_hex(computed) + ", but it carries " +
                          digest_hex(stored) + ", the digest training recorded for global step " +
                          std::to_string(ck.group("trainer").get_int("global_step")) +
                          ": changed after it was computed (docs/replay.md)");
}

std::string inspect_checkpoint(const std::string& path, Env* env) {
  const Checkpoint ck = load_checkpoint(path, env);
  FileInfo info;
  const long long bytes = env_or_posix(env).stat(path, info) == 0 ? static_cast<long long>(info.size) : -1;
  std::ostringstream o;
  o << "checkpoint " << path << "\n";
  o << "  file            " << bytes << " bytes, checksum ok\n";
  o << "  format_version  " << ck.meta.format_version << "\n";
  o << "  engine_version  " << ck.meta.engine_version << "\n";
  o << "  created_utc     " << ck.meta.created_utc << "\n";
  o << "  saved_on        " << ck.meta.saved_on << "\n";
  o << "  config          " << ck.config_json.size() << " bytes of JSON\n";
  for (const std::string& g : group_order(group_names(ck))) {
    const StateDict& d = ck.groups.at(g);
    o << "[" << g << "] " << d.tensors.size() << " tensors, " << d.scalars.size() << " scalars\n";
    std::size_t width = 0;
    for (const auto& kv : d.scalars) width = std::max(width, kv.first.size());
    for (const auto& kv : d.tensors) width = std::max(width, kv.first.size());
    auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w + 2 - std::min(w, s.size()), ' '); };
    for (const auto& [key, s] : d.scalars)
      o << "  " << pad(key, width) << pad(is_series(s) ? "series" : scalar_kind(s), 7) << scalar_text(s) << "\n";
    for (const auto& [key, t] : d.tensors)
      o << "  " << pad(key, width) << pad(dtype_name(t.dtype()), 7) << shape_str(t.shape()) << "  norm "
        << fmt_short(l2_norm(t)) << "\n";
  }
  return o.str();
}

CheckpointDiff diff_checkpoints(const std::string& path_a, const std::string& path_b, Env* env) {
  const Checkpoint a = load_checkpoint(path_a, env);
  const Checkpoint b = load_checkpoint(path_b, env);
  std::ostringstream o;
  int differing = 0;
  o << "a: " << path_a << "\n" << "b: " << path_b << "\n";
  // The verdict is about state: metadata and config are listed, never counted (two
  // runs with different run directories can still hold bit-identical state).
  auto meta = [&](const char* name, const std::string& x, const std::string& y) {
    if (x != y) o << "meta " << name << ": \"" << x << "\" vs \"" << y << "\" (ignored)\n";
  };
  meta("format_version", std::to_string(a.meta.format_version), std::to_string(b.meta.format_version));
  meta("engine_version", a.meta.engine_version, b.meta.engine_version);
  meta("created_utc", a.meta.created_utc, b.meta.created_utc);
  meta("saved_on", a.meta.saved_on, b.meta.saved_on);
  if (a.config_json != b.config_json) o << "config: " << config_difference(a.config_json, b.config_json) << " (ignored)\n";

  std::set<std::string> groups = group_names(a);
  for (const auto& kv : b.groups) groups.insert(kv.first);
  const StateDict empty;
  for (const std::string& g : group_order(groups)) {
    const StateDict& da = a.groups.count(g) ? a.groups.at(g) : empty;
    const StateDict& db = b.groups.count(g) ? b.groups.at(g) : empty;
    if (!a.groups.count(g) || !b.groups.count(g)) {
      o << g << ": group only in " << (a.groups.count(g) ? "a" : "b") << "\n";
      ++differing;
    }
    auto line = [&](const std::string& key, const std::string& verdict, bool differs) {
      o << g << "/" << key << ": " << verdict << "\n";
      if (differs) ++differing;
    };
    std::set<std::string> keys;
    for (const auto& kv : da.scalars) keys.insert(kv.first);
    for (const auto& kv : db.scalars) keys.insert(kv.first);
    for (const std::string& key : keys) {
      auto ia = da.scalars.find(key), ib = db.scalars.find(key);
      if (ia == da.scalars.end() || ib == db.scalars.end()) {
        line(key, ia == da.scalars.end() ? "only in b" : "only in a", true);
        continue;
      }
      bool differs = false;
      const std::string verdict = compare_scalars(ia->second, ib->second, differs);
      if (differs && is_wall_clock(g, key))
        line(key, verdict + " (ignored: wall-clock time)", false);
      else
        line(key, verdict, differs);
    }
    keys.clear();
    for (const auto& kv : da.tensors) keys.insert(kv.first);
    for (const auto& kv : db.tensors) keys.insert(kv.first);
    for (const std::string& key : keys) {
      auto ia = da.tensors.find(key), ib = db.tensors.find(key);
      if (ia == da.tensors.end() || ib == db.tensors.end()) {
        line(key, ia == da.tensors.end() ? "only in b" : "only in a", true);
        continue;
      }
      bool differs = false;
      const std::string verdict = compare_tensors(ia->second, ib->second, differs);
      line(key, verdict, differs);
    }
  }
  CheckpointDiff result;
  result.identical = differing == 0;
  if (result.identical)
    o << "verdict: identical\n";
  else
    o << "verdict: different (" << differing << (differing == 1 ? " entry differs)\n" : " entries differ)\n");
  result.report = o.str();
  return result;
}

}  // namespace engine
