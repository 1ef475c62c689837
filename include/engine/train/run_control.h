// Requests a running Trainer::fit() receives from outside: from a signal handler (the
// CLI's Ctrl-C, SIGTERM, SIGUSR1), another thread, or the host program. Each Trainer
// has its own RunControl, so a request reaches one run and never outlives it.
#pragma once
#include <atomic>
#include <optional>
#include <string>

namespace engine {

class RunControl {
 public:
  // All of these are lock-free atomics: safe from any thread and from a signal handler.
  // Stop after the current step (or evaluation batch), writing last.h5 first. Returns
  // true when a stop had already been requested (a second Ctrl-C).
  bool request_stop() noexcept { return stop_.exchange(true); }
  // Write last.h5 after the current step and go on training (Slurm's --signal=USR1@90).
  void request_checkpoint() noexcept { checkpoint_.store(true); }
  bool stop_requested() const noexcept { return stop_.load(); }

  // fit() consumes the requests it acts on, so a later fit() starts clean.
  bool take_checkpoint_request() noexcept { return checkpoint_.exchange(false); }
  void clear_stop() noexcept { stop_.store(false); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> checkpoint_{false};
};

// A wall-clock duration as schedulers write them: "5400" or "5400s", "90m", "1.5h",
// "MM:SS", "HH:MM:SS", "D-HH:MM:SS" (Slurm). Returns seconds, or nothing when the text
// is none of these or not positive.
std::optional<double> parse_duration_seconds(const std::string& text);

}  // namespace engine
