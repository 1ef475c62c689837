#include "engine/nn/scaler.h"

#include <cmath>

#include "core/tensor_ops.h"

namespace engine {

LossScaler::LossScaler(bool enabled, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval)
    : enabled_(enabled), scale_(enabled ? init_scale : 1.0), init_scale_(init_scale),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor), growth_interval_(growth_interval) {}

bool LossScaler::unscale(const std::vector<Parameter*>& params) {
  if (!active_ || params.empty()) return false;
  const Device d = params.front()->grad.device();
  if (!found_inf_.defined() || found_inf_.device() != d)
    found_inf_ = Tensor::empty({1}, DType::I32, d);
  found_inf_.zero();
  // float32, as GradScaler does: inv_scale = 1/scale rounded to float.
  const float inv_scale = static_cast<float>(1.0 / scale_);
  for (Parameter* p : params) tt::unscale_check(p->grad, inv_scale, found_inf_);
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
}

}  // namespace engine
