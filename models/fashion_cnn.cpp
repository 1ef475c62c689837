#include "engine/nn/models/fashion_cnn.h"

namespace engine {

FashionCnn::FashionCnn(float dropout)
    : dropout_p_(dropout), conv1_("conv1", 1, 32, 3, 1), bn1_("bn1", 32), conv2_("conv2", 32, 64, 3, 1),
      bn2_("bn2", 64), fc1_("fc1", 64 * 7 * 7, 128), dropout_("dropout", dropout),
      fc2_("fc2", 128, kClasses) {
  // Pooling before ReLU: relu(max(window)) is max(relu(window)) (ReLU does not decrease),
  // so the outputs are the same bits and ReLU runs on a quarter of the values. The
  // gradients too: the mask y > 0 at a window's argmax is the pooled output's, and a
  // window whose maximum is <= 0 passes 0 in either order (only a NaN in a window,
  // which max keeps and ReLU maps to 0, would tell the orders apart).
  set_layers({&conv1_, &bn1_, &pool1_, &relu1_, &conv2_, &bn2_, &pool2_, &relu2_, &flatten_, &fc1_,
              &relu3_, &dropout_, &fc2_});
}

void FashionCnn::reset_parameters(Rng& rng) {
  // Module order, as PyTorch constructs them; BatchNorm starts at weight 1, bias 0.
  conv1_.reset_parameters(rng);
  conv2_.reset_parameters(rng);
  fc1_.reset_parameters(rng);
  fc2_.reset_parameters(rng);
}

void FashionCnn::set_precision(Precision p) {
  conv1_.set_precision(p);
  conv2_.set_precision(p);
  fc1_.set_precision(p);
  fc2_.set_precision(p);
}

std::unique_ptr<Model> FashionCnn::new_instance() const { return std::make_unique<FashionCnn>(dropout_p_); }

}  // namespace engine
