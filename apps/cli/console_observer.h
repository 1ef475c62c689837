// What `engine train` and `resume` print while they train.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "engine/train/trainer.h"

namespace engine::cli {

// The host's own observer (engine::cli::run's `also`; null: none): hears every training
// event the console does, after it. Set before a command runs.
void set_host_observer(TrainerObserver* also);

// Terminal: a live progress bar per epoch. Pipe/file: one plain line per epoch.
class ConsoleObserver : public TrainerObserver {
 public:
  ConsoleObserver();
  void on_message(const std::string& m) override;
  void on_epoch_begin(int64_t epoch, int64_t epochs, int64_t steps) override;
  void on_progress(const Progress& p) override;
  void on_epoch_end(const EpochMetrics& m) override;
  void on_step_end(int64_t global_step) override;
  void on_checkpoint(const std::string& path, CheckpointKind kind) override;
  // Called once, after the next step ends (the relaunch time: "resumed in ...").
  void after_next_step(std::function<void()> f) { after_next_step_ = std::move(f); }

 private:
  void clear();
  bool tty_;
  bool bar_shown_ = false;
  int64_t epoch_ = 0, epochs_ = 0;
  std::function<void()> after_next_step_;
};

// "test: loss 0.3012  accuracy 89.10% (10000 images)"
void print_test(const EvalResult& t);

}  // namespace engine::cli
