// The one uniform state interface. Every stateful component (model, optimizer,
// scheduler, scaler, RNG, trainer counters, metrics) describes its whole state as
// named tensors plus named scalars, so the checkpoint layer saves and restores
// everything generically and can report exactly what is missing or unexpected.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "engine/core/tensor.h"

namespace engine {

// A named scalar: an integer counter, a real number, a text, or a series of reals
// (metrics history). Integers stay int64 so counters never pass through a float.
using Scalar = std::variant<int64_t, double, std::string, std::vector<double>>;
const char* scalar_kind(const Scalar& s);  // "int64", "float64", "string", "float64[]"

struct StateDict {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, Scalar> scalars;

  bool empty() const { return tensors.empty() && scalars.empty(); }
  // Typed accessors that throw std::runtime_error naming the key when it is absent
  // or of another kind.
  int64_t get_int(const std::string& key) const;
  double get_real(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<double>& get_series(const std::string& key) const;
  const Tensor& get_tensor(const std::string& key) const;
};

// What differs between the state a component expects and the state given to it.
struct StateReport {
  std::vector<std::string> missing;     // expected, not given
  std::vector<std::string> unexpected;  // given, not expected
  std::vector<std::string> mismatched;  // both, but shape/dtype/kind differ ("key: why")
  bool clean() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // Prefixes every key with `group` + "/" and appends to this report.
  void merge(const StateReport& other, const std::string& group);
  std::string str() const;  // multi-line, one key per line; "" when clean
  std::string summary() const;  // one line, every key: "2 missing (a, b), 1 unexpected (c)"
};

// Compares keys, tensor shapes and dtypes, and scalar kinds. Series may differ in length.
StateReport compare_state(const StateDict& expected, const StateDict& given);

// Returns `current` with every entry of `given` that matches it (same key, shape,
// dtype, kind) substituted: what a non-strict load applies. Tensors in `given` may be
// on any device; the result keeps them as given (load_state copies into place).
StateDict merge_matching(const StateDict& current, const StateDict& given);

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The complete current state. Tensors may alias the live storage.
  virtual StateDict state() const = 0;
  // Replaces the state. `in` has exactly the keys, shapes and kinds state() reports
  // (callers check with compare_state first), so this never half-applies.
  virtual void load_state(const StateDict& in) = 0;
};

}  // namespace engine
