#include "engine/nn/scheduler.h"
#include "kernels/det_math.h"

#include <cmath>
#include <stdexcept>

namespace engine {

namespace {
const double kPi = 3.14159265358979323846;
const char* kind_name(ScheduleKind k) { return k == ScheduleKind::Cosine ? "cosine" : "constant"; }
}  // namespace

LrScheduler::LrScheduler(const std::string& name, double base_lr, int64_t t_max, double eta_min)
    : base_lr_(base_lr), t_max_(t_max), eta_min_(eta_min) {
  if (name == "cosine")
    kind_ = ScheduleKind::Cosine;
  else if (name == "constant")
    kind_ = ScheduleKind::Constant;
  else
    throw std::invalid_argument("unknown scheduler '" + name + "' (known: cosine, constant)");
  if (t_max < 1) throw std::invalid_argument("scheduler t_max must be >= 1");
}

double LrScheduler::lr() const {
  if (kind_ == ScheduleKind::Constant) return base_lr_;
  return eta_min_ + (base_lr_ - eta_min_) *
                        (1.0 + kernels::det::cos(kPi * static_cast<double>(last_epoch_) /
                                        static_cast<double>(t_max_))) / 2.0;
}

StateDict LrScheduler::state() const {
  StateDict d;
  d.scalars["name"] = std::string(kind_name(kind_));
  d.scalars["base_lr"] = base_lr_;
  d.scalars["eta_min"] = eta_min_;
  d.scalars["t_max"] = t_max_;
  d.scalars["last_epoch"] = last_epoch_;
  return d;
}

void LrScheduler::load_state(const StateDict& in) {
  if (in.get_string("name") != kind_name(kind_))
    throw std::runtime_error("scheduler state is for '" + in.get_string("name") +
                             "' but the config asks for '" + kind_name(kind_) + "'");
  // The counter is the state; base_lr, t_max and eta_min follow the config, so a
  // resumed run with --set train.epochs=30 stretches the schedule as asked.
  last_epoch_ = in.get_int("last_epoch");
}

}  // namespace engine
