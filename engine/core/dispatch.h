// Private to the op facade (core/tensor_ops.cpp, core/batchnorm_ops.cpp): every kernel
// runs through the op table of the device its data lives on (kernels/op_table.h), after
// the op's preconditions (OpChecks) have held.
#pragma once
#include <cstdint>
#include <string>

#include "engine/core/tensor.h"
#include "kernels/op_table.h"

namespace engine::tt::detail {

inline const kernels::OpTable& ops_on(Device d) {
  return d.is_cuda() ? kernels::cuda_ops() : kernels::cpu_ops();
}

// One op's preconditions, checked before any kernel runs: each tensor named, with the
// dtype and the element count the op's shape needs, every one on the device of the
// first. A violation throws std::invalid_argument, one line naming the op, the layer
// (when there is one) and the tensor:
//   tt::conv2d_forward (conv1): w is float32[288] on cpu, the op needs float32[320] on cpu
class OpChecks {
 public:
  explicit OpChecks(const char* op, const std::string* layer = nullptr) : op_(op), layer_(layer) {}
  // Exactly `numel` elements.
  OpChecks& exact(const char* name, const Tensor& t, DType dtype, int64_t numel);
  // The same, or undefined (a null bias or its gradient).
  OpChecks& optional(const char* name, const Tensor& t, DType dtype, int64_t numel);
  // At least `numel` elements: the op reads or writes a range of the tensor.
  OpChecks& at_least(const char* name, const Tensor& t, DType dtype, int64_t numel);
  // A value in device memory (a per-step value), on the device of the tensors.
  OpChecks& value(const char* name, const void* ptr, Device device);
  // The same, or null (not wanted).
  OpChecks& optional_value(const char* name, const void* ptr, Device device) {
    return ptr ? value(name, ptr, device) : *this;
  }
  // A condition on the shape, `what` saying what must hold ("H and W even").
  OpChecks& that(bool holds, const char* what);
  // The device every tensor checked is on.
  Device device() const { return device_; }

 private:
  [[noreturn]] void fail(const std::string& what) const;
  void check(const char* name, const Tensor& t, DType dtype, int64_t numel, bool or_more);
  const char* op_;
  const std::string* layer_;
  bool has_device_ = false;
  Device device_;
};

}  // namespace engine::tt::detail
