#include "engine/nn/scaler.h"

#include <cstddef>
#include <stdexcept>

#include "core/tensor_ops.h"
#include "kernels/elementwise.h"

namespace engine {

namespace {

constexpr std::size_t kStateBytes = sizeof(kernels::LossScaleState);

const unsigned char* bytes_of(const Tensor& t) { return static_cast<const unsigned char*>(t.raw()); }

}  // namespace

LossScaler::LossScaler(bool enabled, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval)
    : enabled_(enabled), scale_(enabled ? init_scale : 1.0), init_scale_(init_scale),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor), growth_interval_(growth_interval) {}

double LossScaler::scale() const {
  pull();
  return scale_;
}

int64_t LossScaler::growth_tracker() const {
  pull();
  return growth_tracker_;
}

void LossScaler::push(Device device) {
  if (device_state_.defined() && device_state_.device() == device && newer_ != Newer::Host) return;
  pull();  // a device copy elsewhere may be the newer one
  kernels::LossScaleState s;
  s.scale = scale_;
  s.growth_tracker = growth_tracker_;
  kernels::loss_scale_factors(s);
  s.found_inf = 0;
  if (!device_state_.defined() || device_state_.device() != device)
    device_state_ = Tensor::empty({static_cast<int64_t>(kStateBytes)}, DType::U8, device);
  device_copy(device, device_state_.raw(), Device::cpu(), &s, kStateBytes);
  newer_ = Newer::Same;
}

void LossScaler::pull() const {
  if (newer_ != Newer::Device) return;
  kernels::LossScaleState s;
  device_copy(Device::cpu(), &s, device_state_.device(), device_state_.raw(), kStateBytes);
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  newer_ = Newer::Same;
}

bool LossScaler::unscale(const std::vector<Parameter*>& params) {
  if (!active_ || params.empty()) return false;
  unscale_on_device(params);
  int32_t flag = 0;
  const DeviceValue<int32_t> found = device_found_inf();
  device_copy(Device::cpu(), &flag, found.device, found.ptr, sizeof flag);
  return flag != 0;
}

void LossScaler::update(bool found_inf) {
  if (!active_) return;
  pull();
  // The rule of the device's update, on the host's copy (kernels/elementwise.h).
  kernels::LossScaleState s;
  s.scale = scale_;
  s.growth_tracker = growth_tracker_;
  s.found_inf = found_inf ? 1 : 0;
  kernels::loss_scale_update_rule(s, kernels::LossScaleRule{growth_factor_, backoff_factor_, growth_interval_});
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  if (device_state_.defined()) newer_ = Newer::Host;
}

DeviceValue<float> LossScaler::device_loss_scale(Device device) {
  if (!active_) throw std::logic_error("LossScaler::device_loss_scale: the scaler is not active");
  push(device);
  const auto* at = reinterpret_cast<const float*>(bytes_of(device_state_) + offsetof(kernels::LossScaleState, scale_f32));
  // value: the host's copy, maybe older than the device's (reading that would wait).
  return {at, device, static_cast<float>(scale_)};
}

void LossScaler::unscale_on_device(const std::vector<Parameter*>& params) {
  if (!active_ || params.empty()) return;
  push(params.front()->grad.device());
  for (Parameter* p : params) tt::unscale_check(p->grad, device_state_);
  newer_ = Newer::Device;
}

DeviceValue<int32_t> LossScaler::device_found_inf() const {
  if (!device_state_.defined()) throw std::logic_error("LossScaler::device_found_inf: no state on a device yet");
  const auto* at = reinterpret_cast<const int32_t*>(bytes_of(device_state_) + offsetof(kernels::LossScaleState, found_inf));
  return {at, device_state_.device(), 0};
}

void LossScaler::update_on_device() {
  if (!active_) return;
  if (!device_state_.defined()) throw std::logic_error("LossScaler::update_on_device: no state on a device yet");
  tt::loss_scale_update(device_state_, kernels::LossScaleRule{growth_factor_, backoff_factor_, growth_interval_});
  newer_ = Newer::Device;
}

void LossScaler::replayed_step() {
  if (!active_) return;
  if (!device_state_.defined()) throw std::logic_error("LossScaler::replayed_step: no state on a device yet");
  newer_ = Newer::Device;
}

StateDict LossScaler::state() const {
  pull();
  StateDict d;
  d.scalars["enabled"] = static_cast<int64_t>(enabled_ ? 1 : 0);
  d.scalars["scale"] = scale_;
  d.scalars["growth_factor"] = growth_factor_;
  d.scalars["backoff_factor"] = backoff_factor_;
  d.scalars["growth_interval"] = growth_interval_;
  d.scalars["growth_tracker"] = growth_tracker_;
  return d;
}

void LossScaler::load_state(const StateDict& in) {
  // The config decides whether scaling is on (enabled_ stays as constructed); scale and
  // tracker are the evolving state and continue when the checkpoint was scaling too. A
  // checkpoint that was not (fp32) holds a placeholder scale of 1: an fp16 resume of it
  // starts from the configured initial scale, as a fresh fp16 run does.
  const bool saved_enabled = in.get_int("enabled") != 0;
  const double saved_scale = in.get_real("scale");
  const int64_t saved_tracker = in.get_int("growth_tracker");
  if (enabled_ && saved_enabled) {
    scale_ = saved_scale;
    growth_tracker_ = saved_tracker;
  } else {
    scale_ = enabled_ ? init_scale_ : 1.0;
    growth_tracker_ = 0;
  }
  newer_ = device_state_.defined() ? Newer::Host : Newer::Same;
}

}  // namespace engine
