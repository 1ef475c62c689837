// Dynamic loss scaling with PyTorch GradScaler semantics. The loss is multiplied by
// scale(); gradients are unscaled by 1/scale and checked. A non-finite gradient skips
// the optimizer step and multiplies the scale by backoff_factor (tracker reset);
// otherwise the tracker counts up and, at growth_interval, the scale grows by
// growth_factor (tracker reset). Disabled (fp32), the scale is 1 and nothing changes,
// but the state is still saved so an fp16 run's scaler survives a CPU resume.
#pragma once
#include <vector>

#include "engine/nn/module.h"

namespace engine {

enum class ScalerMode { Enabled, Disabled };

class LossScaler : public Stateful {
 public:
  LossScaler(bool enabled, double init_scale, double growth_factor, double backoff_factor,
             int64_t growth_interval);

  bool enabled() const { return enabled_; }
  // Whether this process applies scaling (enabled and the device runs fp16). When
  // inactive, the saved state passes through untouched.
  void set_active(bool active) { active_ = active && enabled_; }
  bool active() const { return active_; }
  // The factor to scale the loss by in this step (1 when inactive).
  float loss_scale() const { return active_ ? static_cast<float>(scale_) : 1.0f; }
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }

  // Unscales every gradient in place; returns true when the optimizer step must be
  // skipped (some gradient is inf or NaN). Then call update(found_inf).
  bool unscale(const std::vector<Parameter*>& params);
  void update(bool found_inf);

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  bool enabled_;
  bool active_ = false;
  double scale_, init_scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  int64_t growth_tracker_ = 0;
  Tensor found_inf_;  // one int32 on the parameters' device
};

}  // namespace engine
