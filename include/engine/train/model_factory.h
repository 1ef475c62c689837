// The model a resolved config names: model.name from the registry
// (engine/nn/models/registry.h), shaped for the config's dataset. The config is the
// train layer's, so this is here rather than beside the registry.
#pragma once
#include <functional>
#include <memory>

#include "engine/nn/model.h"
#include "engine/train/config.h"

namespace engine {

// A model built from a resolved config: what the inference API needs to rebuild the
// model a checkpoint's config names (engine::Classifier); make_model is the default.
using ModelFactory = std::function<std::unique_ptr<Model>(const Config&)>;

// The model cfg.model names, shaped for cfg.data's dataset (make_dataset, which reads
// nothing for this). Throws std::invalid_argument as make_model_for does.
std::unique_ptr<Model> make_model(const Config& cfg);

}  // namespace engine
