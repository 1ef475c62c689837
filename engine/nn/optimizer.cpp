#include "engine/nn/optimizer.h"

#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/step_values.h"
#include "core/tensor_ops.h"
#include "kernels/det_math.h"

namespace engine {

namespace {

// The constants of every element's update, in float as the kernels take them.
kernels::AdamHyper hyper(const std::string& name, double lr, double beta1, double beta2, double eps,
                         double weight_decay) {
  kernels::AdamHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(beta1);
  h.beta2 = static_cast<float>(beta2);
  h.eps = static_cast<float>(eps);
  h.weight_decay = static_cast<float>(weight_decay);
  h.decay = name == "adamw" ? kernels::WeightDecayMode::Decoupled : kernels::WeightDecayMode::L2;
  return h;
}

}  // namespace

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

void AdamOptimizer::prepare_step(StepValues& values) const {
  pull_steps();
  values.scalars.lr = lr_;
  values.adam.resize(slots_.size());
  // Bias corrections in double on the host, as PyTorch computes them for a CPU step
  // count (kernels/elementwise.h: the same function step_on_device runs on the device).
  const kernels::AdamFactorInputs in{beta1_, beta2_, weight_decay_};
  for (std::size_t i = 0; i < slots_.size(); ++i) values.adam[i] = kernels::adam_factors_at(lr_, in, slots_[i].step + 1);
}

void AdamOptimizer::pull_steps() const {
  if (steps_newer_ != Newer::Device) return;
  std::vector<int64_t> steps(slots_.size());
  device_copy(Device::cpu(), steps.data(), device_steps_.device(), device_steps_.raw(), steps.size() * sizeof(int64_t));
  for (std::size_t i = 0; i < slots_.size(); ++i) slots_[i].step = steps[i];
  steps_newer_ = Newer::Same;
}

void AdamOptimizer::step_on_device(const StepValues& values, DeviceValue<int32_t> skip) {
  require_whole("step_on_device()");
  if (slots_.empty()) return;
  const Device d = slots_.front().param->value.device();
  const int64_t count = static_cast<int64_t>(slots_.size());
  if (!device_steps_.defined() || device_steps_.device() != d || steps_newer_ == Newer::Host) {
    pull_steps();
    std::vector<int64_t> steps;
    for (const Slot& s : slots_) steps.push_back(s.step);
    if (!device_steps_.defined() || device_steps_.device() != d) {
      device_steps_ = Tensor::empty({count * static_cast<int64_t>(sizeof(int64_t))}, DType::U8, d);
      device_factors_ = Tensor::zeros({count * static_cast<int64_t>(sizeof(kernels::AdamStepFactors))}, DType::U8, d);
    }
    device_copy(d, device_steps_.raw(), Device::cpu(), steps.data(), steps.size() * sizeof(int64_t));
  }
  tt::adam_prepare_step(static_cast<int>(count), values.lr(), kernels::AdamFactorInputs{beta1_, beta2_, weight_decay_},
                        skip, device_steps_, device_factors_);
  steps_newer_ = Newer::Device;
  const kernels::AdamHyper h = hyper(name_, lr_, beta1_, beta2_, eps_, weight_decay_);
  const auto* factors = static_cast<const kernels::AdamStepFactors*>(device_factors_.raw());
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    Tensor& p = s.param->value;
    const int64_t first = s.count < 0 ? 0 : s.offset, n = s.count < 0 ? p.numel() : s.count;
    if (n == 0) continue;
    tt::adam_update(p, s.param->grad, first, n, s.exp_avg, s.exp_avg_sq, h, {factors + i, d, {}}, skip,
                    digest_sums_, static_cast<int64_t>(i));
  }
}

void AdamOptimizer::step() {
  if (slots_.empty()) return;
  if (!own_values_) own_values_ = std::make_shared<StepValues>();
  prepare_step(*own_values_);
  own_values_->upload(slots_.front().param->value.device());
  step(*own_values_);
}

void AdamOptimizer::replayed_step(StepCounts counts) {
  if (counts == StepCounts::OnDevice) {
    // A read since the capture (a save, the epoch's metrics) may have set Same: the
    // replayed adam_prepare_step moved the device's counts on, by 1 or (skipped) by 0.
    steps_newer_ = Newer::Device;
    return;
  }
  // As step(values) does on the host.
  pull_steps();
  if (device_steps_.defined()) steps_newer_ = Newer::Host;
  for (Slot& s : slots_) ++s.step;
}

void AdamOptimizer::step(const StepValues& values) {
  pull_steps();
  if (device_steps_.defined()) steps_newer_ = Newer::Host;
  const kernels::AdamHyper h = hyper(name_, lr_, beta1_, beta2_, eps_, weight_decay_);
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    ++s.step;
    Tensor& p = s.param->value;
    const int64_t first = s.count < 0 ? 0 : s.offset, n = s.count < 0 ? p.numel() : s.count;
    if (n == 0) continue;  // no element of this parameter in this rank's shard
    tt::adam_update(p, s.param->grad, first, n, s.exp_avg, s.exp_avg_sq, h, values.adam_factors(i), {},
                    digest_sums_, static_cast<int64_t>(i));
  }
}

std::vector<std::string> AdamOptimizer::parameter_names() const {
  std::vector<std::string> names;
  for (const Slot& s : slots_) names.push_back(s.param->name);
  return names;
}

void AdamOptimizer::shard(const ParameterShards& shards) {
  if (sharded_) return;
  int64_t total = 0;
  for (const Slot& s : slots_) total += s.param->value.numel();
  if (shards.total() != total)
    throw std::logic_error("AdamOptimizer::shard: the shards are of other parameters");
  for (Slot& s : slots_)
    if (!s.exp_avg.device().is_cpu()) throw std::logic_error("AdamOptimizer::shard: the moments are not on the CPU");
  std::vector<const ParameterShards::Segment*> mine(slots_.size(), nullptr);
  for (const ParameterShards::Segment& seg : shards.segments()) mine.at(seg.index) = &seg;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.offset = mine[i] ? mine[i]->offset : 0;
    s.count = mine[i] ? mine[i]->count : 0;
    Tensor m = Tensor::empty({s.count}), v = Tensor::empty({s.count});
    std::copy(s.exp_avg.f32() + s.offset, s.exp_avg.f32() + s.offset + s.count, m.f32());
    std::copy(s.exp_avg_sq.f32() + s.offset, s.exp_avg_sq.f32() + s.offset + s.count, v.f32());
    s.exp_avg = m;
    s.exp_avg_sq = v;
  }
  sharded_ = true;
}

void AdamOptimizer::unshard(const ParameterShards& shards) {
  if (!sharded_) return;
  std::vector<float> m_shard, v_shard;
  for (const Slot& s : slots_) {
    m_shard.insert(m_shard.end(), s.exp_avg.f32(), s.exp_avg.f32() + s.count);
    v_shard.insert(v_shard.end(), s.exp_avg_sq.f32(), s.exp_avg_sq.f32() + s.count);
  }
  if (static_cast<int64_t>(m_shard.size()) != shards.shard_size(shards.rank()))
    throw std::logic_error("AdamOptimizer::unshard: the shards are not the ones the moments were cut by");
  const std::vector<float> m_all = shards.gather(m_shard.data()), v_all = shards.gather(v_shard.data());
  int64_t at = 0;
  for (Slot& s : slots_) {
    const Shape& shape = s.param->value.shape();
    const int64_t n = s.param->value.numel();
    Tensor m = Tensor::empty(shape), v = Tensor::empty(shape);
    std::copy(m_all.begin() + at, m_all.begin() + at + n, m.f32());
    std::copy(v_all.begin() + at, v_all.begin() + at + n, v.f32());
    s.exp_avg = m;
    s.exp_avg_sq = v;
    s.offset = 0;
    s.count = -1;
    at += n;
  }
  sharded_ = false;
}

int64_t AdamOptimizer::moment_bytes() const {
  int64_t bytes = 0;
  for (const Slot& s : slots_) bytes += static_cast<int64_t>(s.exp_avg.nbytes() + s.exp_avg_sq.nbytes());
  return bytes;
}

int64_t AdamOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const Slot& s : slots_) bytes += 2 * static_cast<int64_t>(s.param->value.numel() * sizeof(float));
  return bytes;
}

void AdamOptimizer::require_whole(const char* what) const {
  if (sharded_)
    throw std::logic_error(std::string("optimizer ") + what + ": the moments are sharded over the ranks (ZeRO-1); "
                           "they are whole again after AdamOptimizer::unshard (the Trainer gathers them for "
                           "every save and when fit() returns)");
}

void AdamOptimizer::to(Device device) {
  require_whole("to()");
  pull_steps();
  for (Slot& s : slots_) {
    if (s.exp_avg.device() == device) continue;
    s.exp_avg = s.exp_avg.to(device);
    s.exp_avg_sq = s.exp_avg_sq.to(device);
  }
}

StateDict AdamOptimizer::state() const {
  require_whole("state()");
  pull_steps();
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
  require_whole("load_state()");
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
  if (device_steps_.defined()) steps_newer_ = Newer::Host;
}

}  // namespace engine
