#include <stdexcept>

#include "core/dispatch.h"

namespace engine::tt::detail {

void OpChecks::fail(const std::string& what) const {
  std::string where = std::string("tt::") + op_;
  if (layer_ && !layer_->empty()) where += " (" + *layer_ + ")";
  throw std::invalid_argument(where + ": " + what);
}

void OpChecks::check(const char* name, const Tensor& t, DType dtype, int64_t numel, bool or_more) {
  const Device d = t.device();
  const bool size_ok = or_more ? t.numel() >= numel : t.numel() == numel;
  const bool device_ok = !has_device_ || d == device_;
  if (!t.defined() && numel > 0) fail(std::string(name) + " is missing (no tensor)");
  if (t.defined() && (t.dtype() != dtype || !size_ok || !device_ok)) {
    const Device want = has_device_ ? device_ : d;
    fail(std::string(name) + " is " + dtype_name(t.dtype()) + "[" + std::to_string(t.numel()) + "] on " +
         d.str() + ", the op needs " + dtype_name(dtype) + "[" + (or_more ? "at least " : "") +
         std::to_string(numel) + "] on " + want.str());
  }
  if (t.defined() && !has_device_) {
    device_ = d;
    has_device_ = true;
  }
}

OpChecks& OpChecks::exact(const char* name, const Tensor& t, DType dtype, int64_t numel) {
  check(name, t, dtype, numel, false);
  return *this;
}

OpChecks& OpChecks::optional(const char* name, const Tensor& t, DType dtype, int64_t numel) {
  if (t.defined()) check(name, t, dtype, numel, false);
  return *this;
}

OpChecks& OpChecks::at_least(const char* name, const Tensor& t, DType dtype, int64_t numel) {
  check(name, t, dtype, numel, true);
  return *this;
}

OpChecks& OpChecks::value(const char* name, const void* ptr, Device device) {
  if (!ptr) fail(std::string(name) + " is missing (no value in device memory)");
  if (has_device_ && device != device_)
    fail(std::string(name) + " is a value on " + device.str() + ", the op needs it on " + device_.str());
  if (!has_device_) {
    device_ = device;
    has_device_ = true;
  }
  return *this;
}

OpChecks& OpChecks::that(bool holds, const char* what) {
  if (!holds) fail(std::string("needs ") + what);
  return *this;
}

}  // namespace engine::tt::detail
