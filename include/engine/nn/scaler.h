// Dynamic loss scaling with PyTorch GradScaler semantics. The loss is multiplied by
// scale(); gradients are unscaled by 1/scale and checked. A non-finite gradient skips
// the optimizer step and multiplies the scale by backoff_factor (tracker reset);
// otherwise the tracker counts up and, at growth_interval, the scale grows by
// growth_factor (tracker reset). Disabled (fp32), the scale is 1 and nothing changes,
// but the state is still saved so an fp16 run's scaler survives a CPU resume.
#pragma once
#include <vector>

#include "engine/core/device.h"

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
  float loss_scale() const { return active_ ? static_cast<float>(scale()) : 1.0f; }
  // The state. After a step on the device (below) these read it back from there: a copy
  // that waits for the device, for the saves and the epoch's metrics.
  double scale() const;
  int64_t growth_tracker() const;

  // Unscales every gradient in place; returns true when the optimizer step must be
  // skipped (some gradient is inf or NaN). Then call update(found_inf). (A read-back of
  // the overflow flag: the readable form of the step below.)
  bool unscale(const std::vector<Parameter*>& params);
  void update(bool found_inf);

  // The same step kept on the device, nothing read back (the trainer's fp16 step): the
  // loss's scale, where the loss kernel reads it (on `device`; the state moves there on
  // first use); the unscale of every gradient, which sets the overflow flag; the flag,
  // which the optimizer's update reads to skip; and the update of the scale, which
  // clears the flag.
  DeviceValue<float> device_loss_scale(Device device);
  void unscale_on_device(const std::vector<Parameter*>& params);
  DeviceValue<int32_t> device_found_inf() const;
  void update_on_device();
  // The host's part of a step whose unscale_on_device and update_on_device a CUDA graph
  // replays (engine/train/step_graphs.h): the device's state is the newer from here, even
  // when a read since the capture made the two copies the same.
  void replayed_step();

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  // Sends the host's state to `device` when the device's is missing or older.
  void push(Device device);
  // Reads the device's state back when it is newer than the host's.
  void pull() const;

  bool enabled_;
  bool active_ = false;
  mutable double scale_;
  double init_scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  mutable int64_t growth_tracker_ = 0;
  // The state on the device (bytes: one kernels::LossScaleState); which copy is newer.
  Tensor device_state_;
  enum class Newer { Same, Host, Device };
  mutable Newer newer_ = Newer::Same;
};

}  // namespace engine
