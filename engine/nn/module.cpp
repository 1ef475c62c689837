#include "engine/nn/module.h"

#include <vector>

namespace engine {

void Layer::to(Device) {}

Tensor& Layer::ensure(Tensor& t, const Shape& shape, Device device, DType dtype) {
  if (!t.defined() || t.shape() != shape || t.device() != device || t.dtype() != dtype) {
    t = Tensor();  // release first: never hold the old and the new buffer at once
    t = Tensor::empty(shape, dtype, device);
  }
  return t;
}

void init_uniform(Tensor& t, float bound, Rng& rng) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  rng.fill_uniform(RngStream::Init, host.data(), t.numel(), -bound, bound);
  t.copy_from(Tensor::from_vector(t.shape(), host));
}

}  // namespace engine
