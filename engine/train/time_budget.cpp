#include "train/time_budget.h"

#include <algorithm>

namespace engine {

TimeBudget::TimeBudget(Env& env, Clock::time_point start, double limit_seconds)
    : env_(env), start_(start), limit_(limit_seconds) {}

double TimeBudget::remaining() const {
  return limit_ - std::chrono::duration<double>(env_.monotonic_now() - start_).count();
}

double TimeBudget::margin() const { return std::max(0.25, 0.02 * limit_); }

void TimeBudget::record_step(double seconds) {
  // A slow step (page faults, a noisy neighbour) raises the estimate at once; it comes
  // down only slowly, so one fast step does not make the budget optimistic.
  step_ = step_ < 0 ? seconds : std::max(seconds, 0.95 * step_ + 0.05 * seconds);
}

void TimeBudget::record_eval(double seconds, int64_t images) {
  if (images > 0) eval_per_image_ = std::max(eval_per_image_, seconds / static_cast<double>(images));
}

double TimeBudget::step_estimate() const { return step_ < 0 ? 0 : 1.25 * step_; }

double TimeBudget::eval_estimate(int64_t images, int batch_size) const {
  if (eval_per_image_ >= 0) return 1.25 * eval_per_image_ * static_cast<double>(images);
  // An eval pass is a forward only: about a third of a training step per batch.
  const double batches = static_cast<double>((images + batch_size - 1) / std::max(batch_size, 1));
  return step_estimate() * batches / 2;
}

bool TimeBudget::fits(double seconds, double save_seconds) const {
  return seconds + save_seconds + margin() <= remaining();
}

}  // namespace engine
