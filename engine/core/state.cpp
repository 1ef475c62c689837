#include "engine/core/state.h"

#include <sstream>
#include <stdexcept>

namespace engine {

const char* scalar_kind(const Scalar& s) {
  switch (s.index()) {
    case 0: return "int64";
    case 1: return "float64";
    case 2: return "string";
    default: return "float64[]";
  }
}

namespace {
template <class T>
const T& get_as(const StateDict& d, const std::string& key, const char* want) {
  auto it = d.scalars.find(key);
  if (it == d.scalars.end()) throw std::runtime_error("state key '" + key + "' is missing");
  if (auto p = std::get_if<T>(&it->second)) return *p;
  throw std::runtime_error("state key '" + key + "' is " + scalar_kind(it->second) +
                           ", expected " + want);
}
}  // namespace

int64_t StateDict::get_int(const std::string& key) const { return get_as<int64_t>(*this, key, "int64"); }
double StateDict::get_real(const std::string& key) const { return get_as<double>(*this, key, "float64"); }
const std::string& StateDict::get_string(const std::string& key) const {
  return get_as<std::string>(*this, key, "string");
}
const std::vector<double>& StateDict::get_series(const std::string& key) const {
  return get_as<std::vector<double>>(*this, key, "float64[]");
}
const Tensor& StateDict::get_tensor(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) throw std::runtime_error("state tensor '" + key + "' is missing");
  return it->second;
}

void StateReport::merge(const StateReport& other, const std::string& group) {
  const std::string p = group.empty() ? "" : group + "/";
  for (auto& k : other.missing) missing.push_back(p + k);
  for (auto& k : other.unexpected) unexpected.push_back(p + k);
  for (auto& k : other.mismatched) mismatched.push_back(p + k);
}

std::string StateReport::str() const {
  std::ostringstream o;
  for (auto& k : missing) o << "  missing:    " << k << "\n";
  for (auto& k : unexpected) o << "  unexpected: " << k << "\n";
  for (auto& k : mismatched) o << "  mismatched: " << k << "\n";
  return o.str();
}

std::string StateReport::summary() const {
  std::ostringstream o;
  auto part = [&](const std::vector<std::string>& v, const char* what) {
    if (v.empty()) return;
    if (o.tellp() > 0) o << ", ";
    o << v.size() << ' ' << what << " (";
    for (std::size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    o << ')';
  };
  part(missing, "missing");
  part(unexpected, "unexpected");
  part(mismatched, "mismatched");
  return o.str();
}

StateReport compare_state(const StateDict& expected, const StateDict& given) {
  StateReport r;
  for (auto& [k, t] : expected.tensors) {
    auto it = given.tensors.find(k);
    if (it == given.tensors.end()) {
      r.missing.push_back(k);
    } else if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) {
      r.mismatched.push_back(k + ": expected " + dtype_name(t.dtype()) + shape_str(t.shape()) +
                             ", got " + dtype_name(it->second.dtype()) +
                             shape_str(it->second.shape()));
    }
  }
  for (auto& [k, t] : given.tensors)
    if (!expected.tensors.count(k)) r.unexpected.push_back(k);
  for (auto& [k, s] : expected.scalars) {
    auto it = given.scalars.find(k);
    if (it == given.scalars.end())
      r.missing.push_back(k);
    else if (it->second.index() != s.index())
      r.mismatched.push_back(k + ": expected " + scalar_kind(s) + ", got " +
                             scalar_kind(it->second));
  }
  for (auto& [k, s] : given.scalars)
    if (!expected.scalars.count(k)) r.unexpected.push_back(k);
  return r;
}

StateDict merge_matching(const StateDict& current, const StateDict& given) {
  StateDict out = current;
  for (auto& [k, t] : current.tensors) {
    auto it = given.tensors.find(k);
    if (it != given.tensors.end() && it->second.shape() == t.shape() &&
        it->second.dtype() == t.dtype())
      out.tensors[k] = it->second;
  }
  for (auto& [k, s] : current.scalars) {
    auto it = given.scalars.find(k);
    if (it != given.scalars.end() && it->second.index() == s.index()) out.scalars[k] = it->second;
  }
  return out;
}

}  // namespace engine
