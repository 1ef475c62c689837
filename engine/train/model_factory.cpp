#include "engine/train/model_factory.h"

#include "engine/io/dataset.h"
#include "engine/nn/models/registry.h"

namespace engine {

std::unique_ptr<Model> make_model(const Config& cfg) {
  const std::unique_ptr<Dataset> data = make_dataset(cfg.data, Device::cpu());  // reads nothing
  return make_model_for(cfg.model, data->sample_shape(), data->num_classes());
}

}  // namespace engine
