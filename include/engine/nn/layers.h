// The layers the models are built from (models/: the CNN, the MLP). Each runs on the
// device its parameters live on, calling the fast CPU kernels or the CUDA kernels.
#pragma once
#include "engine/nn/module.h"

namespace engine {

// Conv2d and Linear compute in a Precision (engine/kernels/precision.h: on CUDA their ops
// of kernels/op_list.inc run in it; on the CPU in fp32); the other layers are always fp32.

class Conv2d : public Layer {
 public:
  Conv2d(const std::string& name, int in_channels, int out_channels, int kernel, int pad);
  void reset_parameters(Rng& rng);
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  void to(Device device) override;
  void set_precision(Precision p) { precision_ = p; }
  void release_workspaces() override { x_ = y_ = dx_ = Tensor(); }
  // The shape, as an exporter describes the layer (stride 1, square kernel, zero padding).
  int in_channels() const { return in_; }
  int out_channels() const { return out_; }
  int kernel() const { return kernel_; }
  int pad() const { return pad_; }

 private:
  int in_, out_, kernel_, pad_;
  Parameter weight_, bias_;
  Precision precision_ = Precision::Fp32;
  Tensor x_, y_, dx_;
};

class BatchNorm2d : public Layer {
 public:
  BatchNorm2d(const std::string& name, int channels, float eps = 1e-5f, float momentum = 0.1f);
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  // Writes the input gradient over dy (the incoming gradient is not needed afterwards).
  Tensor backward(const Tensor& dy, InputGrad need) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  void buffers(StateDict& out) const override;
  void load_buffers(const StateDict& in) override;
  void to(Device device) override;
  void release_workspaces() override { x_ = y_ = Tensor(); }
  void replayed_train_forward() override { ++num_batches_tracked_; }
  int channels() const { return channels_; }
  float eps() const { return eps_; }

 private:
  int channels_;
  float eps_, momentum_;
  Parameter weight_, bias_;
  Tensor running_mean_, running_var_;
  int64_t num_batches_tracked_ = 0;
  Tensor x_, y_, save_mean_, save_invstd_;
};

// In place, ReLU overwrites its input with the output in forward and the incoming
// gradient with the outgoing one in backward: for inputs nobody else needs afterwards
// (the output of BatchNorm or of a Linear layer), it saves two activation buffers.
// In place, MaxPool2x2 writes its input gradient over its forward input (it keeps only
// the argmax): for an input that the layer before does not need in its backward (the
// output of BatchNorm, which keeps its own input), it saves an input-sized buffer.
enum class InPlace { No, Yes };

class ReLU : public Layer {
 public:
  explicit ReLU(const std::string& name, InPlace in_place = InPlace::No)
      : Layer(name), in_place_(in_place) {}
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;
  void release_workspaces() override { y_ = dx_ = Tensor(); }

 private:
  InPlace in_place_;
  Tensor y_, dx_;
};

class MaxPool2x2 : public Layer {
 public:
  explicit MaxPool2x2(const std::string& name, InPlace in_place = InPlace::No)
      : Layer(name), in_place_(in_place) {}
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;
  void release_workspaces() override { x_ = y_ = argmax_ = dx_ = Tensor(); }

 private:
  InPlace in_place_;
  Shape in_shape_;
  Tensor x_;  // in place: the forward input, which backward overwrites with dx
  Tensor y_, argmax_, dx_;
};

class Flatten : public Layer {
 public:
  using Layer::Layer;
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;

 private:
  Shape in_shape_;
};

class Dropout : public Layer {
 public:
  Dropout(const std::string& name, float p) : Layer(name), p_(p) {}
  // Masks come from the RNG's dropout stream: each training forward reserves
  // numel() outputs, element i uses the output at (first + i), on every device.
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;
  void release_workspaces() override { y_ = keep_ = dx_ = Tensor(); }

 private:
  float p_;
  Mode last_mode_ = Mode::Eval;
  Tensor y_, keep_, dx_;
};

class Linear : public Layer {
 public:
  Linear(const std::string& name, int in_features, int out_features);
  void reset_parameters(Rng& rng);
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  Tensor backward(const Tensor& dy, InputGrad need) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  void to(Device device) override;
  void set_precision(Precision p) { precision_ = p; }
  void release_workspaces() override { x_ = y_ = dx_ = Tensor(); }
  int in_features() const { return in_; }
  int out_features() const { return out_; }

 private:
  int in_, out_;
  Parameter weight_, bias_;
  Precision precision_ = Precision::Fp32;
  Tensor x_, y_, dx_;
};

}  // namespace engine
