// A dense, contiguous, row-major tensor on one device. Shapes follow PyTorch's
// layouts (NCHW activations, OIHW conv weights, [out, in] linear weights).
// Copies of a Tensor share storage; clone() makes an independent copy.
#pragma once
#include "engine/kernels/precision.h"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device.h"

namespace engine {

// F64 holds working values of the ops (per-channel sums, block sums of a bias
// gradient); no state the checkpoint saves is float64.
enum class DType { F32, F16, I32, U8, F64 };
std::size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "float16", "int32", "uint8", "float64"

// Precision (the arithmetic of the convolution and linear ops): engine/kernels/precision.h.

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[32, 1, 3, 3]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // Host float data -> tensor on `device`.
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values,
                            Device device = Device::cpu());
  // A CPU tensor over `data`, which lives as long as `owner` does (the tensor and its
  // copies keep `owner` alive). `data` must be 64-byte aligned, like every CPU
  // allocation, because the CPU kernels rely on it. Used by the checkpoint loader to
  // hand out tensors inside the verified file buffer instead of copying them.
  static Tensor wrap_host(std::shared_ptr<void> owner, void* data, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() { return storage_ ? storage_->ptr : nullptr; }
  const void* raw() const { return storage_ ? storage_->ptr : nullptr; }
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  uint8_t* u8();
  const uint8_t* u8() const;
  double* f64();
  const double* f64() const;

  // Same storage, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  // Same storage, its first numel(shape) elements under a new shape; throws
  // when the storage is smaller. A layer's buffer sized for a full batch serves the
  // epoch's last, smaller batch this way instead of a second allocation beside it.
  Tensor prefix_view(const Shape& shape) const;
  // Bytes of the storage under this tensor: nbytes(), or more for a prefix view.
  std::size_t storage_bytes() const { return storage_ ? storage_->bytes : 0; }
  // Independent copy on `device` (same device when omitted).
  Tensor to(Device device) const;
  Tensor clone() const { return to(device_); }
  // Copies values from `src` (same shape and dtype, any device).
  void copy_from(const Tensor& src);
  void zero();
  // Host copy of float32 data, whatever the device.
  std::vector<float> to_vector() const;

 private:
  struct Storage {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    Device device;
    std::shared_ptr<void> owner;  // set when the memory is borrowed, not allocated
    ~Storage();
  };
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
};

// Makes `t` a buffer of this shape, dtype and device, and returns it: kept as it is, a
// prefix view of its storage when the shape fits there (the epoch's last, smaller batch),
// else a new allocation, the old buffer released first (never both at once). A buffer
// that is reused keeps its address: what a CUDA graph of the training step needs.
Tensor& reuse_buffer(Tensor& t, const Shape& shape, DType dtype, Device device);

}  // namespace engine
