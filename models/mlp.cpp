#include "engine/nn/models/mlp.h"

#include <stdexcept>

namespace engine {

namespace {
int checked_features(const ImageShape& s) {
  if (s.channels <= 0 || s.height <= 0 || s.width <= 0 || s.numel() > (int64_t{1} << 30))
    throw std::invalid_argument("mlp: input shape " + s.str() + " is not valid");
  return static_cast<int>(s.numel());
}
int checked_positive(int v, const char* what) {
  if (v <= 0) throw std::invalid_argument(std::string("mlp: ") + what + " must be positive, got " + std::to_string(v));
  return v;
}
}  // namespace

Mlp::Mlp(ImageShape input, int hidden, int classes, float dropout)
    : input_(input), hidden_(hidden), classes_(classes), dropout_p_(dropout),
      fc1_("fc1", checked_features(input), checked_positive(hidden, "hidden width")),
      dropout_("dropout", dropout), fc2_("fc2", hidden, checked_positive(classes, "classes")) {
  set_layers({&flatten_, &fc1_, &relu_, &dropout_, &fc2_});
}

void Mlp::reset_parameters(Rng& rng) {
  fc1_.reset_parameters(rng);
  fc2_.reset_parameters(rng);
}

void Mlp::set_precision(Precision p) {
  fc1_.set_precision(p);
  fc2_.set_precision(p);
}

std::unique_ptr<Model> Mlp::new_instance() const {
  return std::make_unique<Mlp>(input_, hidden_, classes_, dropout_p_);
}

}  // namespace engine
