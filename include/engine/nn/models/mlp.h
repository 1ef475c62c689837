// A small multi-layer perceptron, equivalent to this PyTorch module:
//   flatten; fc1 = Linear(C*H*W, hidden); relu; dropout(p); fc2 = Linear(hidden, classes)
// For any image shape and number of classes (on Fashion-MNIST: 784 -> 128 -> 10,
// 101,770 parameters). State keys: fc1.weight, fc1.bias, fc2.weight, fc2.bias.
#pragma once
#include <memory>
#include <string>

#include "engine/nn/layers.h"
#include "engine/nn/model.h"

namespace engine {

class Mlp : public SequentialModel {
 public:
  Mlp(ImageShape input, int hidden, int classes, float dropout);

  std::string name() const override { return "mlp"; }
  ImageShape input_shape() const override { return input_; }
  int num_classes() const override { return classes_; }
  // PyTorch's default Linear initialisation, fc1 then fc2, from the init stream.
  void reset_parameters(Rng& rng) override;
  void set_precision(Precision p) override;
  std::unique_ptr<Model> new_instance() const override;

 private:
  ImageShape input_;
  int hidden_, classes_;
  float dropout_p_;
  Flatten flatten_{"flatten"};
  Linear fc1_;
  ReLU relu_{"relu", InPlace::Yes};
  Dropout dropout_;
  Linear fc2_;
};

}  // namespace engine
