#include "engine/nn/models/registry.h"

#include <stdexcept>

#include "engine/nn/models/fashion_cnn.h"
#include "engine/nn/models/mlp.h"

namespace engine {

namespace {
constexpr int kMlpHidden = 128;

std::string known_names() {
  std::string s;
  for (const std::string& n : model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

std::vector<std::string> model_names() { return {"fashion_cnn", "mlp"}; }

std::unique_ptr<Model> make_model_for(const ModelConfig& cfg, const ImageShape& input, int classes) {
  const float dropout = static_cast<float>(cfg.dropout);
  if (cfg.name == "fashion_cnn") {
    auto m = std::make_unique<FashionCnn>(dropout);
    if (m->input_shape() != input || m->num_classes() != classes)
      throw std::invalid_argument("model fashion_cnn takes " + m->input_shape().str() + " images in " +
                                  std::to_string(m->num_classes()) + " classes, the data has " +
                                  input.str() + " in " + std::to_string(classes));
    return m;
  }
  if (cfg.name == "mlp") return std::make_unique<Mlp>(input, kMlpHidden, classes, dropout);
  throw std::invalid_argument("unknown model '" + cfg.name + "' (known: " + known_names() + ")");
}

}  // namespace engine
