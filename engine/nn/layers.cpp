#include "engine/nn/layers.h"

#include <cmath>
#include <stdexcept>

#include "core/tensor_ops.h"

namespace engine {

namespace {
Parameter make_param(const std::string& name, const Shape& shape) {
  return Parameter{name, Tensor::zeros(shape), Tensor::zeros(shape)};
}
void move_param(Parameter& p, Device d) {
  if (p.value.device() == d) return;
  p.value = p.value.to(d);
  p.grad = p.grad.to(d);
}
void expect_rank(const Tensor& x, int rank, const std::string& layer) {
  if (x.rank() != rank)
    throw std::invalid_argument(layer + ": expected a rank-" + std::to_string(rank) +
                                " input, got " + shape_str(x.shape()));
}
}  // namespace

// Every layer computes through the op facade (core/tensor_ops.h), which picks the
// backend and cuts the batch by the chunks of the trainer's batch plan (batch_chunks_;
// null: the whole batch in one process); the layers know nothing of ranks.

// ---- Conv2d -------------------------------------------------------------------
Conv2d::Conv2d(const std::string& name, int in_channels, int out_channels, int kernel, int pad)
    : Layer(name), in_(in_channels), out_(out_channels), kernel_(kernel), pad_(pad),
      weight_(make_param(name + ".weight", {out_channels, in_channels, kernel, kernel})),
      bias_(make_param(name + ".bias", {out_channels})) {}

void Conv2d::reset_parameters(Rng& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_ * kernel_ * kernel_));
  init_uniform(weight_.value, bound, rng);
  init_uniform(bias_.value, bound, rng);
}

void Conv2d::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
}

Tensor Conv2d::forward(const Tensor& x, Mode, Rng&) {
  expect_rank(x, 4, name_);
  const Device d = weight_.value.device();
  tt::ConvShape s{static_cast<int>(x.dim(0)), in_, static_cast<int>(x.dim(2)), static_cast<int>(x.dim(3)),
                  out_, kernel_, kernel_, pad_};
  ensure(y_, {s.n, s.k, s.out_h(), s.out_w()}, d);
  x_ = x;
  tt::conv2d_forward({batch_chunks_, precision_, name_}, s, x, weight_.value, bias_.value, y_);
  return y_;
}

Tensor Conv2d::backward(const Tensor& dy, InputGrad need) {
  const Device d = weight_.value.device();
  tt::ConvShape s{static_cast<int>(x_.dim(0)), in_, static_cast<int>(x_.dim(2)), static_cast<int>(x_.dim(3)),
                  out_, kernel_, kernel_, pad_};
  Tensor* dx = need == InputGrad::Needed ? &ensure(dx_, x_.shape(), d) : nullptr;
  tt::conv2d_backward({batch_chunks_, precision_, name_}, s, x_, weight_.value, dy, dx, weight_.grad, bias_.grad);
  return need == InputGrad::Needed ? dx_ : Tensor();
}

// ---- BatchNorm2d --------------------------------------------------------------
BatchNorm2d::BatchNorm2d(const std::string& name, int channels, float eps, float momentum)
    : Layer(name), channels_(channels), eps_(eps), momentum_(momentum),
      weight_(make_param(name + ".weight", {channels})), bias_(make_param(name + ".bias", {channels})),
      running_mean_(Tensor::zeros({channels})), running_var_(Tensor::zeros({channels})) {
  weight_.value.copy_from(Tensor::from_vector({channels}, std::vector<float>(channels, 1.0f)));
  running_var_.copy_from(weight_.value);
}

void BatchNorm2d::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
  if (running_mean_.device() != d) {
    running_mean_ = running_mean_.to(d);
    running_var_ = running_var_.to(d);
  }
}

void BatchNorm2d::buffers(StateDict& out) const {
  out.tensors["running_mean"] = running_mean_;
  out.tensors["running_var"] = running_var_;
  out.scalars["num_batches_tracked"] = num_batches_tracked_;
}

void BatchNorm2d::load_buffers(const StateDict& in) {
  running_mean_.copy_from(in.get_tensor("running_mean"));
  running_var_.copy_from(in.get_tensor("running_var"));
  num_batches_tracked_ = in.get_int("num_batches_tracked");
}

Tensor BatchNorm2d::forward(const Tensor& x, Mode mode, Rng&) {
  expect_rank(x, 4, name_);
  const Device d = weight_.value.device();
  tt::BatchNormShape s{static_cast<int>(x.dim(0)), channels_, static_cast<int>(x.dim(2) * x.dim(3))};
  ensure(y_, x.shape(), d);
  if (mode == Mode::Train) {
    x_ = x;
    ensure(save_mean_, {channels_}, d);
    ensure(save_invstd_, {channels_}, d);
    tt::batchnorm_forward_train({batch_chunks_, Precision::Fp32, name_}, s, x, weight_.value, bias_.value, eps_,
                                momentum_, running_mean_, running_var_, save_mean_, save_invstd_, y_);
    ++num_batches_tracked_;
  } else {
    tt::batchnorm_forward_eval(s, x, weight_.value, bias_.value, running_mean_, running_var_, eps_, y_);
  }
  return y_;
}

Tensor BatchNorm2d::backward(const Tensor& dy, InputGrad) {
  tt::BatchNormShape s{static_cast<int>(x_.dim(0)), channels_, static_cast<int>(x_.dim(2) * x_.dim(3))};
  Tensor dx = dy;  // in place: batchnorm_backward allows dx == dy
  tt::batchnorm_backward({batch_chunks_, Precision::Fp32, name_}, s, x_, dy, weight_.value, save_mean_,
                         save_invstd_, dx, weight_.grad, bias_.grad);
  return dx;
}

// ---- ReLU ---------------------------------------------------------------------
Tensor ReLU::forward(const Tensor& x, Mode, Rng&) {
  if (in_place_ == InPlace::Yes)
    y_ = x;
  else
    ensure(y_, x.shape(), x.device());
  tt::relu_forward(x, y_);
  return y_;
}

Tensor ReLU::backward(const Tensor& dy, InputGrad) {
  if (in_place_ == InPlace::Yes)
    dx_ = dy;
  else
    ensure(dx_, dy.shape(), dy.device());
  tt::relu_backward(y_, dy, dx_);
  return dx_;
}

// ---- MaxPool2x2 ---------------------------------------------------------------
Tensor MaxPool2x2::forward(const Tensor& x, Mode mode, Rng&) {
  expect_rank(x, 4, name_);
  if (x.dim(2) % 2 || x.dim(3) % 2)
    throw std::invalid_argument(name_ + ": input height and width must be even, got " +
                                shape_str(x.shape()));
  in_shape_ = x.shape();
  tt::PoolShape s{static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), static_cast<int>(x.dim(2)),
              static_cast<int>(x.dim(3))};
  const Shape out{x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2};
  ensure(y_, out, x.device());
  ensure(argmax_, out, x.device(), DType::I32);
  tt::maxpool2x2_forward(s, x, y_, argmax_);
  x_ = in_place_ == InPlace::Yes && mode == Mode::Train ? x : Tensor();
  return y_;
}

Tensor MaxPool2x2::backward(const Tensor& dy, InputGrad) {
  tt::PoolShape s{static_cast<int>(in_shape_[0]), static_cast<int>(in_shape_[1]),
              static_cast<int>(in_shape_[2]), static_cast<int>(in_shape_[3])};
  if (in_place_ == InPlace::Yes) {
    if (!x_.defined() || x_.shape() != in_shape_)
      throw std::logic_error(name_ + ": backward without a training forward");
    tt::maxpool2x2_backward(s, dy, argmax_, x_);
    return x_;
  }
  ensure(dx_, in_shape_, dy.device());
  tt::maxpool2x2_backward(s, dy, argmax_, dx_);
  return dx_;
}

// ---- Flatten ------------------------------------------------------------------
Tensor Flatten::forward(const Tensor& x, Mode, Rng&) {
  in_shape_ = x.shape();
  // Per-sample size from the shape, not numel / N: a rank may hold no sample of a batch.
  int64_t features = 1;
  for (int d = 1; d < x.rank(); ++d) features *= x.dim(d);
  return x.reshape({x.dim(0), features});
}

Tensor Flatten::backward(const Tensor& dy, InputGrad) { return dy.reshape(in_shape_); }

// ---- Dropout ------------------------------------------------------------------
Tensor Dropout::forward(const Tensor& x, Mode mode, Rng& rng) {
  last_mode_ = mode;
  if (mode == Mode::Eval || p_ == 0.0f) return x;
  ensure(y_, x.shape(), x.device());
  ensure(keep_, x.shape(), x.device(), DType::U8);
  tt::dropout_forward({batch_chunks_, Precision::Fp32, name_}, x, p_, rng, y_, keep_);
  return y_;
}

Tensor Dropout::backward(const Tensor& dy, InputGrad) {
  if (last_mode_ == Mode::Eval || p_ == 0.0f) return dy;
  ensure(dx_, dy.shape(), dy.device());
  tt::dropout_backward(dy, keep_, p_, dx_);
  return dx_;
}

// ---- Linear -------------------------------------------------------------------
Linear::Linear(const std::string& name, int in_features, int out_features)
    : Layer(name), in_(in_features), out_(out_features),
      weight_(make_param(name + ".weight", {out_features, in_features})),
      bias_(make_param(name + ".bias", {out_features})) {}

void Linear::reset_parameters(Rng& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  init_uniform(weight_.value, bound, rng);
  init_uniform(bias_.value, bound, rng);
}

void Linear::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
}

Tensor Linear::forward(const Tensor& x, Mode, Rng&) {
  expect_rank(x, 2, name_);
  if (x.dim(1) != in_)
    throw std::invalid_argument(name_ + ": expected " + std::to_string(in_) + " features, got " +
                                shape_str(x.shape()));
  const Device d = weight_.value.device();
  tt::LinearShape s{static_cast<int>(x.dim(0)), in_, out_};
  ensure(y_, {s.n, out_}, d);
  x_ = x;
  tt::linear_forward({batch_chunks_, precision_, name_}, s, x, weight_.value, bias_.value, y_);
  return y_;
}

Tensor Linear::backward(const Tensor& dy, InputGrad need) {
  const Device d = weight_.value.device();
  tt::LinearShape s{static_cast<int>(x_.dim(0)), in_, out_};
  Tensor* dx = need == InputGrad::Needed ? &ensure(dx_, x_.shape(), d) : nullptr;
  tt::linear_backward({batch_chunks_, precision_, name_}, s, x_, weight_.value, dy, dx, weight_.grad, bias_.grad);
  return need == InputGrad::Needed ? dx_ : Tensor();
}

}  // namespace engine
