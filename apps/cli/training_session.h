// Everything `train` and `resume` share once each has its config: the console, the
// signal handlers, restoring, "already complete", and the run's end. The job is the
// library's RunSession (engine/run/run_session.h): under mpirun/srun every rank builds one;
// rank 0 alone prints and owns the run directory (its lock, checkpoints, metrics), the
// other ranks train silently and write nothing (docs/distributed.md).
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

#include "cli/console_observer.h"
#include "cli/run_options.h"
#include "engine/run/run_session.h"

namespace engine::cli {

class TrainingSession {
 public:
  // The run directory's lock is taken here (rank 0), before the data is loaded, so that
  // a second writer is refused at once.
  TrainingSession(Config cfg, const RunOptions& o);

  Trainer& start();

  // Ranks started with another config, build, data or checkpoint than rank 0 are refused
  // by every rank (exit 2) before anything is trained (docs/distributed.md "Faults").
  void require_same_start(const std::string& checkpoint);

  // `engine train`: the library's recovery on start (RunSession::begin, docs/recovery.md):
  // --fresh, or the newest sound checkpoint of every tier, the repairs, "already complete".
  void begin(StartFrom from);

  const Config& config() const { return session_.config(); }
  Device device() const { return session_.device(); }

  static void print_load_report(const StateReport& r);

  // After an explicit restore (engine resume FILE): the library's "already complete", and
  // otherwise the memory tier started from the restored state (RunSession::continue_from_restored).
  void continue_from_restored();

  // Trains to the end or to a stop, and returns the command's exit status.
  int run();

 private:
  void print_header();
  static void print_agreement(const StartAgreement& a, const std::string& checkpoint);
  [[noreturn]] static void refuse_mismatch(const StartMismatchError& e);

  void print_relaunch_time() const;

  using Clock = std::chrono::steady_clock;
  Clock::time_point entered_ = Clock::now();  // first: before the session joins its job
  Clock::time_point started_, begun_;
  RunBegin::Seconds begin_seconds_;
  std::size_t copies_surveyed_ = 0, tiers_surveyed_ = 0;
  bool memory_tier_surveyed_ = false;
  RunOptions opts_;
  ConsoleObserver observer_;  // before session_: the trainer it holds reports to it
  RunSession session_;
  bool already_complete_ = false;
};

}  // namespace engine::cli
