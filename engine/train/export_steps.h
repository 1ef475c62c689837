// Private to the export (engine/train/export*.cpp): the model as a chain of inference
// steps, the model rebuilt from such a chain, and the shapes checked through it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/image_shape.h"
#include "engine/nn/layers.h"
#include "engine/nn/model.h"

namespace engine {
namespace export_internal {

// What an exported graph is made of: the inference view of the engine's layers (Dropout
// is the identity at inference and leaves no step).
struct Step {
  enum class Kind { Conv, BatchNorm, MaxPool2x2, Relu, Flatten, Linear };
  Kind kind = Kind::Relu;
  std::string name;  // the layer's name: its parameters are "<name>.weight", ...
  int in = 0, out = 0, kernel = 0, pad = 0;
  float eps = 0;
};

// The steps of `model`; throws ExportError for a model that is not a chain of layers
// with an export.
std::vector<Step> describe(const Model& model);

// A model rebuilt from steps (what an ONNX file describes), run by the engine's layers.
class LayerChain : public SequentialModel {
 public:
  LayerChain(std::string name, ImageShape input, int classes, std::vector<Step> steps)
      : name_(std::move(name)), input_(input), classes_(classes), steps_(std::move(steps)) {
    std::vector<Layer*> chain;
    for (const Step& s : steps_) {
      switch (s.kind) {
        case Step::Kind::Conv: owned_.push_back(std::make_unique<Conv2d>(s.name, s.in, s.out, s.kernel, s.pad)); break;
        case Step::Kind::BatchNorm: owned_.push_back(std::make_unique<BatchNorm2d>(s.name, s.in, s.eps)); break;
        case Step::Kind::MaxPool2x2: owned_.push_back(std::make_unique<MaxPool2x2>(s.name)); break;
        case Step::Kind::Relu: owned_.push_back(std::make_unique<ReLU>(s.name)); break;
        case Step::Kind::Flatten: owned_.push_back(std::make_unique<Flatten>(s.name)); break;
        case Step::Kind::Linear: owned_.push_back(std::make_unique<Linear>(s.name, s.in, s.out)); break;
      }
      chain.push_back(owned_.back().get());
    }
    set_layers(chain);
  }
  std::string name() const override { return name_; }
  ImageShape input_shape() const override { return input_; }
  int num_classes() const override { return classes_; }
  void reset_parameters(Rng&) override {}  // the parameters come from the file
  void set_precision(Precision) override {}
  std::unique_ptr<Model> new_instance() const override {
    return std::make_unique<LayerChain>(name_, input_, classes_, steps_);
  }

 private:
  std::string name_;
  ImageShape input_;
  int classes_;
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Layer>> owned_;
};

// The shapes through the chain: refuses a graph whose layers do not fit together
// before any layer runs.
// `max_elements` bounds every activation (per probe), so that a small file cannot make
// the engine allocate or compute without bound.
void check_chain(const std::vector<Step>& steps, const ImageShape& input, int classes, int64_t max_elements,
                 const std::string& origin);

// The logits of `probes` images `inputs` (row-major [probes, C, H, W]) through `model`.
std::vector<float> run_probes(Model& model, const ImageShape& shape, const std::vector<float>& inputs, int probes);

}  // namespace export_internal
}  // namespace engine
