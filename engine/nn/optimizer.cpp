#include "engine/optimizer.h"

#include "kernels/elementwise.h"

#include <cmath>
#include <stdexcept>

#include "nn/dispatch.h"
#include "kernels/det_math.h"

namespace engine {

AdamOptimizer::AdamOptimizer(const std::string& name, std::vector<Parameter*> params, double lr,
                             double beta1, double beta2, double eps, double weight_decay)
    : name_(name), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  if (name != "adamw" && name != "adam")
    throw std::invalid_argument("unknown optimizer '" + name + "' (known: adamw, adam)");
  for (Parameter* p : params) {
    const Device d = p->value.device();
    slots_.push_back({p, Tensor::zeros(p->value.shape(), DType::F32, d),
                      Tensor::zeros(p->value.shape(), DType::F32, d), 0});
  }
}

void AdamOptimizer::step() {
  kernels::AdamHyper h;
  h.lr = static_cast<float>(lr_);
  h.beta1 = static_cast<float>(beta1_);
  h.beta2 = static_cast<float>(beta2_);
  h.eps = static_cast<float>(eps_);
  h.weight_decay = static_cast<float>(weight_decay_);
  h.decay = name_ == "adamw" ? kernels::WeightDecayMode::Decoupled : kernels::WeightDecayMode::L2;
  for (Slot& s : slots_) {
    ++s.step;
    // Bias corrections in double on the host, as PyTorch computes them for a CPU step
    // count; beta^t by the engine's own power (kernels/det_math.h), the same on every CPU.
    const int64_t t = s.step;
    kernels::AdamStepFactors f;
    f.step_size = static_cast<float>(lr_ / (1.0 - kernels::det::pow_int(beta1_, t)));
    f.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - kernels::det::pow_int(beta2_, t)));
    f.decay_factor = static_cast<float>(1.0 - lr_ * weight_decay_);
    f.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    f.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    Tensor& p = s.param->value;
    ENGINE_DISPATCH(p.device(), adam_update, p.numel(), p.f32(), s.param->grad.f32(),
                    s.exp_avg.f32(), s.exp_avg_sq.f32(), h, f);
  }
}

void AdamOptimizer::to(Device device) {
  for (Slot& s : slots_) {
    if (s.exp_avg.device() == device) continue;
    s.exp_avg = s.exp_avg.to(device);
    s.exp_avg_sq = s.exp_avg_sq.to(device);
  }
}

StateDict AdamOptimizer::state() const {
  StateDict d;
  d.scalars["name"] = name_;
  d.scalars["lr"] = lr_;
  d.scalars["beta1"] = beta1_;
  d.scalars["beta2"] = beta2_;
  d.scalars["eps"] = eps_;
  d.scalars["weight_decay"] = weight_decay_;
  for (const Slot& s : slots_) {
    d.tensors["exp_avg/" + s.param->name] = s.exp_avg;
    d.tensors["exp_avg_sq/" + s.param->name] = s.exp_avg_sq;
    d.scalars["step/" + s.param->name] = s.step;
  }
  return d;
}

void AdamOptimizer::load_state(const StateDict& in) {
  if (in.get_string("name") != name_)
    throw std::runtime_error("optimizer state is for '" + in.get_string("name") +
                             "' but the config asks for '" + name_ + "'");
  // Hyper-parameters come from the config (so --set can change them on resume);
  // the learning rate is recomputed by the scheduler from its step counter.
  for (Slot& s : slots_) {
    s.exp_avg.copy_from(in.get_tensor("exp_avg/" + s.param->name));
    s.exp_avg_sq.copy_from(in.get_tensor("exp_avg_sq/" + s.param->name));
    s.step = in.get_int("step/" + s.param->name);
  }
}

}  // namespace engine
