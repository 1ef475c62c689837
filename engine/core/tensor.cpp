#include "engine/core/tensor.h"

#include <cstdint>
#include <sstream>
#include <stdexcept>

namespace engine {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
    case DType::F64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    case DType::F64: return "float64";
  }
  return "?";
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor::Storage::~Storage() {
  if (ptr && !owner) device_free(device, ptr);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative tensor dimension in " + shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->device = device;
  t.storage_->bytes = t.nbytes();
  // Always allocate at least one byte so raw() is never null for a defined tensor.
  t.storage_->ptr = device_alloc(device, t.storage_->bytes ? t.storage_->bytes : 1);
  return t;
}

Tensor Tensor::wrap_host(std::shared_ptr<void> owner, void* data, const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative tensor dimension in " + shape_str(shape));
  if (!owner || !data) throw std::invalid_argument("wrap_host: no memory to wrap");
  if (reinterpret_cast<std::uintptr_t>(data) % 64 != 0)
    throw std::invalid_argument("wrap_host: memory is not 64-byte aligned");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = Device::cpu();
  t.storage_ = std::make_shared<Storage>();
  t.storage_->device = Device::cpu();
  t.storage_->bytes = t.nbytes();
  t.storage_->ptr = data;
  t.storage_->owner = std::move(owner);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values, Device device) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::F32, device);
  device_copy(device, t.raw(), Device::cpu(), values.data(), t.nbytes());
  return t;
}

namespace {
void expect_dtype(const Tensor& t, DType want) {
  if (t.dtype() != want)
    throw std::logic_error(std::string("tensor is ") + dtype_name(t.dtype()) + ", expected " +
                           dtype_name(want));
}
}  // namespace

float* Tensor::f32() { expect_dtype(*this, DType::F32); return static_cast<float*>(raw()); }
const float* Tensor::f32() const { expect_dtype(*this, DType::F32); return static_cast<const float*>(raw()); }
int32_t* Tensor::i32() { expect_dtype(*this, DType::I32); return static_cast<int32_t*>(raw()); }
const int32_t* Tensor::i32() const { expect_dtype(*this, DType::I32); return static_cast<const int32_t*>(raw()); }
uint8_t* Tensor::u8() { expect_dtype(*this, DType::U8); return static_cast<uint8_t*>(raw()); }
const uint8_t* Tensor::u8() const { expect_dtype(*this, DType::U8); return static_cast<const uint8_t*>(raw()); }
double* Tensor::f64() { expect_dtype(*this, DType::F64); return static_cast<double*>(raw()); }
const double* Tensor::f64() const { expect_dtype(*this, DType::F64); return static_cast<const double*>(raw()); }

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    throw std::invalid_argument("reshape " + shape_str(shape_) + " -> " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor& reuse_buffer(Tensor& t, const Shape& shape, DType dtype, Device device) {
  if (t.defined() && t.device() == device && t.dtype() == dtype) {
    if (t.shape() == shape) return t;
    if (static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype) <= t.storage_bytes())
      return t = t.prefix_view(shape);
  }
  t = Tensor();
  t = Tensor::empty(shape, dtype, device);
  return t;
}

Tensor Tensor::prefix_view(const Shape& shape) const {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative tensor dimension in " + shape_str(shape));
  const std::size_t need = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype_);
  if (!storage_ || need > storage_->bytes)
    throw std::invalid_argument("prefix_view " + shape_str(shape) + ": needs " + std::to_string(need) +
                                " bytes, the storage holds " + std::to_string(storage_bytes()));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  if (nbytes()) device_copy(device, t.raw(), device_, raw(), nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw std::invalid_argument("copy_from: " + shape_str(src.shape_) + " " +
                                dtype_name(src.dtype_) + " into " + shape_str(shape_) + " " +
                                dtype_name(dtype_));
  if (nbytes()) device_copy(device_, raw(), src.device_, src.raw(), nbytes());
}

void Tensor::zero() {
  if (nbytes()) device_memset_zero(device_, raw(), nbytes());
}

std::vector<float> Tensor::to_vector() const {
  expect_dtype(*this, DType::F32);
  std::vector<float> v(static_cast<std::size_t>(numel()));
  if (nbytes()) device_copy(Device::cpu(), v.data(), device_, raw(), nbytes());
  return v;
}

}  // namespace engine
