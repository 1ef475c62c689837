// The Fashion-MNIST CNN (421,834 parameters), equivalent to this PyTorch module:
//   conv1 = Conv2d(1, 32, 3, padding=1); bn1 = BatchNorm2d(32); relu; maxpool(2)
//   conv2 = Conv2d(32, 64, 3, padding=1); bn2 = BatchNorm2d(64); relu; maxpool(2)
//   flatten; fc1 = Linear(3136, 128); relu; dropout(p); fc2 = Linear(128, 10)
// Its state keys are PyTorch's state_dict keys (conv1.weight, bn1.running_mean, ...).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/layers.h"
#include "engine/state.h"

namespace engine {

class FashionCnn : public Stateful {
 public:
  static constexpr int kClasses = 10;
  static constexpr int kImageSide = 28;

  explicit FashionCnn(float dropout = 0.25f);

  // PyTorch's default initialisation, drawn from the RNG's init stream.
  void reset_parameters(Rng& rng);
  void to(Device device);
  Device device() const { return device_; }
  // Frees every layer's activation and gradient buffers (see Layer::release_workspaces).
  void release_workspaces();
  // Fp16: mixed-precision convolutions and linear layers on CUDA (fp32 on the CPU);
  // parameters, BatchNorm and everything else stay fp32. Default Fp32.
  void set_precision(Precision p);

  // x: [N, 1, 28, 28] on the model's device -> logits [N, 10].
  Tensor forward(const Tensor& x, Mode mode, Rng& rng);
  // dlogits: gradient of the loss w.r.t. the logits of the last Train forward.
  void backward(const Tensor& dlogits);

  std::vector<Parameter*> parameters();
  int64_t parameter_count();

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  Device device_ = Device::cpu();
  Conv2d conv1_;
  BatchNorm2d bn1_;
  ReLU relu1_{"relu1", InPlace::Yes};
  MaxPool2x2 pool1_{"pool1"};
  Conv2d conv2_;
  BatchNorm2d bn2_;
  ReLU relu2_{"relu2", InPlace::Yes};
  MaxPool2x2 pool2_{"pool2"};
  Flatten flatten_{"flatten"};
  Linear fc1_;
  ReLU relu3_{"relu3", InPlace::Yes};
  Dropout dropout_;
  Linear fc2_;
  std::vector<Layer*> layers_;  // in forward order
};

// Names of the models the factory knows ("fashion_cnn").
std::vector<std::string> model_names();
std::unique_ptr<FashionCnn> make_model(const std::string& name, float dropout);

}  // namespace engine
