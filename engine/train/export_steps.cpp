// The model as a chain of inference steps (export_steps.h): a model's steps, the shapes
// through a chain read from a file, and the probes run through a model.
#include "train/export_steps.h"

#include "engine/core/rng.h"
#include "engine/train/export.h"

namespace engine {
namespace export_internal {

std::vector<Step> describe(const Model& model) {
  const auto* seq = dynamic_cast<const SequentialModel*>(&model);
  if (!seq) throw ExportError("model " + model.name() + " is not a chain of layers; only those export");
  std::vector<Step> steps;
  for (const Layer* layer : seq->layers()) {
    Step s;
    s.name = layer->name();
    if (const auto* c = dynamic_cast<const Conv2d*>(layer)) {
      s.kind = Step::Kind::Conv, s.in = c->in_channels(), s.out = c->out_channels(), s.kernel = c->kernel(),
      s.pad = c->pad();
    } else if (const auto* b = dynamic_cast<const BatchNorm2d*>(layer)) {
      s.kind = Step::Kind::BatchNorm, s.in = s.out = b->channels(), s.eps = b->eps();
    } else if (dynamic_cast<const MaxPool2x2*>(layer)) {
      s.kind = Step::Kind::MaxPool2x2;
    } else if (dynamic_cast<const ReLU*>(layer)) {
      s.kind = Step::Kind::Relu;
    } else if (dynamic_cast<const Flatten*>(layer)) {
      s.kind = Step::Kind::Flatten;
    } else if (const auto* l = dynamic_cast<const Linear*>(layer)) {
      s.kind = Step::Kind::Linear, s.in = l->in_features(), s.out = l->out_features();
    } else if (dynamic_cast<const Dropout*>(layer)) {
      continue;
    } else {
      throw ExportError("model " + model.name() + ": layer " + layer->name() + " has no export");
    }
    steps.push_back(s);
  }
  return steps;
}

void check_chain(const std::vector<Step>& steps, const ImageShape& input, int classes, int64_t max_elements,
                 const std::string& origin) {
  int64_t c = input.channels, h = input.height, w = input.width;
  bool flat = false;
  for (const Step& s : steps) {
    if (c * h * w > max_elements)
      throw ExportError(origin + ": layer " + s.name + " takes " + std::to_string(c * h * w) +
                        " values per image, more than this file's size allows");
    const auto bad = [&](const std::string& why) { return ExportError(origin + ": layer " + s.name + ": " + why); };
    switch (s.kind) {
      case Step::Kind::Conv:
        if (flat || c != s.in) throw bad("takes " + std::to_string(s.in) + " channels, gets " + std::to_string(c));
        c = s.out, h = h + 2 * s.pad - s.kernel + 1, w = w + 2 * s.pad - s.kernel + 1;
        if (h <= 0 || w <= 0) throw bad("kernel larger than its input");
        break;
      case Step::Kind::BatchNorm:
        if (flat || c != s.in) throw bad("normalises " + std::to_string(s.in) + " channels, gets " + std::to_string(c));
        break;
      case Step::Kind::MaxPool2x2:
        if (flat || h % 2 || w % 2) throw bad("needs an even height and width");
        h /= 2, w /= 2;
        break;
      case Step::Kind::Relu: break;
      case Step::Kind::Flatten:
        c = c * h * w, h = w = 1, flat = true;
        break;
      case Step::Kind::Linear:
        if (!flat || c != s.in) throw bad("takes " + std::to_string(s.in) + " features, gets " + std::to_string(c * h * w));
        c = s.out;
        break;
    }
  }
  if (!flat || c != classes) throw ExportError(origin + ": the graph does not end in " + std::to_string(classes) + " logits");
}

std::vector<float> run_probes(Model& model, const ImageShape& shape, const std::vector<float>& inputs, int probes) {
  const Tensor x = Tensor::from_vector({probes, shape.channels, shape.height, shape.width}, inputs);
  Rng unused(0);  // eval mode draws nothing
  return model.forward(x, Mode::Eval, unused).to_vector();
}

}  // namespace export_internal
}  // namespace engine
