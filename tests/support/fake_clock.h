// Test-only: an Env (engine/io/env.h) whose clocks the test sets, over the real file calls
// of `target`: the wall clock stands still at a chosen time, and the monotonic clock
// moves on by a chosen step at every reading, so a run sees exactly the time the test
// gives it however fast the machine is.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

#include "engine/io/env.h"

namespace engine::fake_clock {

class FakeClockEnv final : public EnvWrapper {
 public:
  using Wall = std::chrono::system_clock;
  using Monotonic = std::chrono::steady_clock;

  explicit FakeClockEnv(Env& target = Env::posix()) : EnvWrapper(target) {}

  void set_wall(Wall::time_point t) { wall_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count(); }
  // Every monotonic_now() returns the previous reading plus `step`.
  void set_monotonic_step(std::chrono::nanoseconds step) { step_ns_ = step.count(); }
  int64_t monotonic_readings() const { return readings_; }

  Wall::time_point wall_now() override {
    return Wall::time_point(std::chrono::duration_cast<Wall::duration>(std::chrono::nanoseconds(wall_ns_.load())));
  }
  Monotonic::time_point monotonic_now() override {
    const int64_t n = ++readings_;
    return Monotonic::time_point(std::chrono::duration_cast<Monotonic::duration>(std::chrono::nanoseconds(n * step_ns_.load())));
  }

 private:
  std::atomic<int64_t> wall_ns_{0};
  std::atomic<int64_t> step_ns_{0};
  std::atomic<int64_t> readings_{0};
};

}  // namespace engine::fake_clock
