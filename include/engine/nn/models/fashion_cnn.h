// The Fashion-MNIST CNN (421,834 parameters), equivalent to this PyTorch module:
//   conv1 = Conv2d(1, 32, 3, padding=1); bn1 = BatchNorm2d(32); relu; maxpool(2)
//   conv2 = Conv2d(32, 64, 3, padding=1); bn2 = BatchNorm2d(64); relu; maxpool(2)
//   flatten; fc1 = Linear(3136, 128); relu; dropout(p); fc2 = Linear(128, 10)
// Its state keys are PyTorch's state_dict keys (conv1.weight, bn1.running_mean, ...).
// It runs each block's max pooling before its ReLU, which gives the same bits with a
// quarter of the ReLU's work (models/fashion_cnn.cpp).
#pragma once
#include <memory>
#include <string>

#include "engine/nn/layers.h"
#include "engine/nn/model.h"

namespace engine {

class FashionCnn : public SequentialModel {
 public:
  static constexpr int kClasses = 10;
  static constexpr int kImageSide = 28;

  explicit FashionCnn(float dropout = 0.25f);

  std::string name() const override { return "fashion_cnn"; }
  ImageShape input_shape() const override { return {1, kImageSide, kImageSide}; }
  int num_classes() const override { return kClasses; }
  // PyTorch's default initialisation, drawn from the RNG's init stream.
  void reset_parameters(Rng& rng) override;
  // Only convolutions and linear layers have an fp16 and a bf16 path (see engine/nn/layers.h).
  void set_precision(Precision p) override;
  std::unique_ptr<Model> new_instance() const override;

 private:
  float dropout_p_;
  Conv2d conv1_;
  BatchNorm2d bn1_;
  ReLU relu1_{"relu1", InPlace::Yes};
  // BatchNorm keeps its input, not its output: the pools write their gradients there.
  MaxPool2x2 pool1_{"pool1", InPlace::Yes};
  Conv2d conv2_;
  BatchNorm2d bn2_;
  ReLU relu2_{"relu2", InPlace::Yes};
  MaxPool2x2 pool2_{"pool2", InPlace::Yes};
  Flatten flatten_{"flatten"};
  Linear fc1_;
  ReLU relu3_{"relu3", InPlace::Yes};
  Dropout dropout_;
  Linear fc2_;
};

}  // namespace engine
