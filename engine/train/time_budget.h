// A wall-clock deadline for a training run (--time-limit): from the times measured so
// far, says whether the next piece of work and the checkpoint after it still fit, so a
// run stops with last.h5 saved before a scheduler's limit instead of being killed. What
// a save costs is the run sink's to say (RunSink::save_estimate): the trainer passes it.
#pragma once
#include <chrono>
#include <cstdint>

#include "engine/io/env.h"

namespace engine {

class TimeBudget {
 public:
  using Clock = std::chrono::steady_clock;
  // `start` is a time of env's monotonic clock, which measures the limit from then.
  TimeBudget(Env& env, Clock::time_point start, double limit_seconds);

  double limit() const { return limit_; }
  double remaining() const;
  // Safety margin kept in hand: 2 % of the limit, at least 0.25 s.
  double margin() const;

  void record_step(double seconds);
  // One pass over `images` images in eval mode.
  void record_eval(double seconds, int64_t images);

  // Estimates (s), conservative: the slowest recent measurement, or a guess from the
  // steps before anything of the kind was measured.
  double step_estimate() const;
  double eval_estimate(int64_t images, int batch_size) const;

  // Whether `seconds` of work plus `save_seconds` (the checkpoint a stop needs) plus the
  // margin still fit.
  bool fits(double seconds, double save_seconds) const;

 private:
  Env& env_;
  Clock::time_point start_;
  double limit_;
  double step_ = -1;        // slowest of the recent steps (decays slowly); -1: none yet
  double eval_per_image_ = -1;
};

}  // namespace engine
