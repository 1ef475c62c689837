// The models a config can name (model.name): what the CLI and the inference API build
// (through make_model, engine/train/model_factory.h).
// Models (models/) are part of the nn layer, below the trainer, which receives its model
// from the caller, so a host can equally pass a model of its own (any engine::Model).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/image_shape.h"
#include "engine/nn/config_sections.h"
#include "engine/nn/model.h"

namespace engine {

// "fashion_cnn" (the default), "mlp".
std::vector<std::string> model_names();

// The model cfg.name names, for samples of `input` shape and `classes` classes.
// Throws std::invalid_argument for an unknown name or a shape the model cannot take.
std::unique_ptr<Model> make_model_for(const ModelConfig& cfg, const ImageShape& input, int classes);

}  // namespace engine
