#include "cli/training_session.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "cli/exit.h"
#include "cli/signals.h"
#include "engine/core/device.h"
#include "engine/run/run_files.h"
#include "engine/train/model_factory.h"

namespace fs = std::filesystem;

namespace engine::cli {
namespace {

// When the process started: --time-limit counts from here, as a scheduler does.
const auto g_process_start = std::chrono::steady_clock::now();

}  // namespace

TrainingSession::TrainingSession(Config cfg, const RunOptions& o)
    : opts_(o), session_(std::move(cfg), RunSessionOptions{/*quiet_other_ranks=*/true}) {
  install_signal_handlers();
}

Trainer& TrainingSession::start() {
  Trainer& t = session_.start(make_model(session_.config()), &observer_);
  if (session_.size() > 1)
    std::cout << "data-parallel on " << session_.size() << " ranks (" << session_.collective().name()
              << (session_.collective().one_host() ? ", one host" : ", several hosts") << ")\n";
  return t;
}

void TrainingSession::require_same_start(const std::string& checkpoint) {
  if (session_.size() == 1) return;
  try {
    print_agreement(session_.agree_on_start(checkpoint), checkpoint);
  } catch (const StartMismatchError& e) {
    refuse_mismatch(e);
  }
}

void TrainingSession::begin(StartFrom from) {
  RunBegin b;
  try {
    b = session_.begin({from, opts_.reevaluate});
  } catch (const StartMismatchError& e) {
    refuse_mismatch(e);
  }
  if (b.agreement) print_agreement(*b.agreement, b.checkpoint);
  print_header();
  for (const std::string& line : b.messages) observer_.on_message(line);
  print_load_report(b.load_report);
  already_complete_ = b.outcome == RunBegin::Outcome::AlreadyComplete;
}

void TrainingSession::print_header() {
  Trainer& t = session_.trainer();
  const Config& cfg = session_.config();
  std::cout << "training " << cfg.model.name << " (" << t.model().parameter_count() << " parameters) on "
            << session_.device().str() << ", run dir " << cfg.checkpoint.dir << "\n";
}

void TrainingSession::print_agreement(const StartAgreement& a, const std::string& checkpoint) {
  std::cout << "ranks agree on config, build, data (" << a.data_bytes / 1000000.0 << " MB) and "
            << (checkpoint.empty() ? "starting fresh" : "checkpoint") << " (hashing " << std::fixed
            << std::setprecision(1) << a.hash_ms << " ms, test split read early " << a.test_load_ms
            << " ms, exchange " << a.exchange_ms << " ms)\n"
            << std::defaultfloat;
}

void TrainingSession::refuse_mismatch(const StartMismatchError& e) {
  // Every rank knows: each says so and exits, no abort needed.
  std::cout << std::flush;
  std::cerr << "engine: " + RunSession::rank_tag() + e.what() + "\n" << std::flush;
  std::exit(kExitUsage);
}

void TrainingSession::print_load_report(const StateReport& r) {
  if (r.clean()) return;
  std::cout << "non-strict load: " << r.summary() << "\n" << r.str();
}

int TrainingSession::run() {
  const Config& cfg = session_.config();
  Trainer& t = session_.trainer();
  if (already_complete_) {
    std::cout << "already complete: " << t.epochs_done() << " epoch(s) trained and the test set evaluated"
              << " (see " << (fs::path(cfg.checkpoint.dir) / run_files::kMetrics).string()
              << "); nothing to do (--reevaluate evaluates the test set again, --set "
                 "train.epochs=N trains on)\n";
    return 0;
  }
  StopPlan stop;
  stop.after_epochs = opts_.stop_after_epochs;
  stop.time_limit_seconds = opts_.time_limit;
  stop.time_limit_from = g_process_start;
  set_signal_target(&t.control());
  FitResult r;
  try {
    r = session_.fit(stop);  // rank 0 through the run directory, the other ranks write nothing
  } catch (const CheckpointWriteError& e) {
    // checkpoint.on_error = stop: the previous checkpoint is intact, so the same command
    // resumes from it once the disk is fixed.
    set_signal_target(nullptr);
    fail(std::string(e.what()) + "; training stopped (checkpoint.on_error = stop), the previous checkpoint is intact",
         kExitSaveFailed);
  }
  set_signal_target(nullptr);
  if (cfg.cuda.graphs && session_.device().is_cuda()) {
    // What cuda.graphs did in this process (0 replays: graphs were asked for but not
    // used, e.g. with cuda.batch_chunks=true or several ranks: docs/config.md).
    const DeviceActivity a = device_activity();
    std::cout << "cuda graphs: " << a.graph_captures << " captured, " << a.graph_launches
              << " launched (steps replayed, and each capture's first run)\n";
  }
  if (r.ending == FitResult::Ending::Stopped) {
    std::cout << "stopped after " << t.epochs_done() << " epoch(s), step " << t.global_step()
              << "; checkpoint in " << cfg.checkpoint.dir << "/last.h5\n";
    switch (r.stop_cause) {
      case FitResult::StopCause::Requested: return kExitInterrupted;
      case FitResult::StopCause::TimeLimit: return kExitTimeLimit;
      default: return 0;
    }
  }
  if (r.test) print_test(*r.test);
  return 0;
}

}  // namespace engine::cli
