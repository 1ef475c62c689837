#include "engine/nn/module.h"

#include <vector>

namespace engine {

void Layer::to(Device) {}

// A smaller batch (the epoch's last) reuses the buffer: other layers may still hold the
// old tensor (BatchNorm keeps its input), so a new one would sit beside it and raise the
// peak.
Tensor& Layer::ensure(Tensor& t, const Shape& shape, Device device, DType dtype) {
  return reuse_buffer(t, shape, dtype, device);
}

void init_uniform(Tensor& t, float bound, Rng& rng) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  rng.fill_uniform(RngStream::Init, host.data(), t.numel(), -bound, bound);
  t.copy_from(Tensor::from_vector(t.shape(), host));
}

}  // namespace engine
