// What the Trainer's source files share (engine/train/trainer.cpp: construction and the
// state groups; trainer_step.cpp: the step and evaluation; run_loop.cpp: fit()).
#pragma once
#include <chrono>

#include "engine/train/config.h"
#include "engine/io/env.h"

namespace engine {

using Clock = std::chrono::steady_clock;

// Seconds on `env`'s monotonic clock since `t0`, a time of that clock.
inline double seconds_since(Env& env, Clock::time_point t0) {
  return std::chrono::duration<double>(env.monotonic_now() - t0).count();
}

inline bool lower_is_better(MonitorMetric monitor) { return monitor == MonitorMetric::ValLoss; }

}  // namespace engine
