#include "engine/nn/module.h"

#include <vector>

namespace engine {

void Layer::to(Device) {}

Tensor& Layer::ensure(Tensor& t, const Shape& shape, Device device, DType dtype) {
  if (t.defined() && t.device() == device && t.dtype() == dtype) {
    if (t.shape() == shape) return t;
    // A smaller batch (the epoch's last) reuses the buffer: other layers may still hold
    // the old tensor (BatchNorm keeps its input), so a new one would sit beside it and
    // raise the peak.
    if (static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype) <= t.storage_bytes())
      return t = t.prefix_view(shape);
  }
  t = Tensor();  // release first: never hold the old and the new buffer at once
  t = Tensor::empty(shape, dtype, device);
  return t;
}

void init_uniform(Tensor& t, float bound, Rng& rng) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  rng.fill_uniform(RngStream::Init, host.data(), t.numel(), -bound, bound);
  t.copy_from(Tensor::from_vector(t.shape(), host));
}

}  // namespace engine
