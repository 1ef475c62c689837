#include "engine/scaler.h"

#include <cmath>

#include "engine/dispatch.h"

namespace engine {

LossScaler::LossScaler(bool enabled, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval)
    : enabled_(enabled), scale_(enabled ? init_scale : 1.0), growth_factor_(growth_factor),
      backoff_factor_(backoff_factor), growth_interval_(growth_interval) {}

bool LossScaler::unscale(const std::vector<Parameter*>& params) {
  if (!active_ || params.empty()) return false;
  const Device d = params.front()->grad.device();
  if (!found_inf_.defined() || found_inf_.device() != d)
    found_inf_ = Tensor::empty({1}, DType::I32, d);
  found_inf_.zero();
  // float32, as GradScaler does: inv_scale = 1/scale rounded to float.
  const float inv_scale = static_cast<float>(1.0 / scale_);
  for (Parameter* p : params)
    ENGINE_DISPATCH(d, unscale_check, p->grad.numel(), p->grad.f32(), inv_scale, found_inf_.i32());
  int32_t flag = 0;
  device_copy(Device::cpu(), &flag, d, found_inf_.raw(), sizeof flag);
  return flag != 0;
}

void LossScaler::update(bool found_inf) {
  if (!active_) return;
  if (found_inf) {
    scale_ *= backoff_factor_;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == growth_interval_) {
    const double grown = scale_ * growth_factor_;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

StateDict LossScaler::state() const {
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
  // scale and tracker are the evolving state; factors follow the config.
  enabled_ = in.get_int("enabled") != 0;
  scale_ = in.get_real("scale");
  growth_tracker_ = in.get_int("growth_tracker");
  active_ = active_ && enabled_;
}

}  // namespace engine
