// Learning-rate schedules stepped once per epoch, like PyTorch's CosineAnnealingLR:
// lr(e) = eta_min + (base_lr - eta_min) * (1 + cos(pi * e / t_max)) / 2, computed in
// closed form from the integer epoch counter, so resuming cannot drift.
#pragma once
#include <string>

#include "engine/core/state.h"

namespace engine {

enum class ScheduleKind { Cosine, Constant };

class LrScheduler : public Stateful {
 public:
  // name: "cosine" or "constant".
  LrScheduler(const std::string& name, double base_lr, int64_t t_max, double eta_min);

  double lr() const;  // learning rate for the epoch about to run
  void step() { ++last_epoch_; }
  int64_t last_epoch() const { return last_epoch_; }

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  ScheduleKind kind_;
  double base_lr_;
  int64_t t_max_;
  double eta_min_;
  int64_t last_epoch_ = 0;
};

}  // namespace engine
