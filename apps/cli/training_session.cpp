#include "cli/training_session.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <unistd.h>

#include "cli/exit.h"
#include "cli/signals.h"
#include "engine/core/device.h"
#include "engine/run/run_files.h"
#include "engine/train/model_factory.h"

namespace fs = std::filesystem;

namespace engine::cli {
namespace {

// Seconds from this process's exec to now: the kernel's start time (clock ticks since
// boot, field 22 of /proc/self/stat) against CLOCK_BOOTTIME; -1 when it cannot be read.
double seconds_since_exec() {
  std::ifstream in("/proc/self/stat");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t name_end = text.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos || name_end + 2 > text.size()) return -1;
  std::istringstream fields(text.substr(name_end + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return -1;
  const long ticks = ::sysconf(_SC_CLK_TCK);
  timespec now{};
  if (ticks <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double started = std::strtod(field.c_str(), nullptr) / static_cast<double>(ticks);
  return std::max(0.0, static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - started);
}

// When the process started: --time-limit counts from here, as a scheduler does. The
// time from exec to here (loading the libraries) is measured once, for "resumed in".
const auto g_process_start = std::chrono::steady_clock::now();
const double g_exec_to_start = seconds_since_exec();

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

TrainingSession::TrainingSession(Config cfg, const RunOptions& o)
    : opts_(o), session_(std::move(cfg), RunSessionOptions{/*quiet_other_ranks=*/true}) {
  install_signal_handlers();
}

Trainer& TrainingSession::start() {
  Trainer& t = session_.start(make_model(session_.config()), &observer_);
  started_ = Clock::now();
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
  begun_ = Clock::now();
  if (b.agreement) print_agreement(*b.agreement, b.checkpoint);
  print_header();
  for (const std::string& line : b.messages) observer_.on_message(line);
  print_load_report(b.load_report);
  already_complete_ = b.outcome == RunBegin::Outcome::AlreadyComplete;
  if (b.outcome == RunBegin::Outcome::Resumed && session_.rank() == 0) {
    begin_seconds_ = b.seconds;
    copies_surveyed_ = b.survey.copies.size();
    tiers_surveyed_ = b.survey.tiers.size();
    memory_tier_surveyed_ = !b.memory_tier_file.empty();
    observer_.after_next_step([this] { print_relaunch_time(); });
  }
}

void TrainingSession::continue_from_restored() {
  already_complete_ = !opts_.reevaluate && session_.already_complete();
  if (already_complete_) return;
  for (const std::string& line : session_.continue_from_restored()) observer_.on_message(line);
}

// "resumed in 0.31 s: ..." once the first step after a resume has ended: the time from
// the process's exec to a trained step, and where it went (docs/recovery.md).
void TrainingSession::print_relaunch_time() const {
  const Clock::time_point now = Clock::now();
  const double exec = std::max(0.0, g_exec_to_start);
  // begin() beyond its measured parts (the lock's checks, the agreement of ranks).
  const double rest_of_begin = std::max(
      0.0, seconds_between(started_, begun_) - begin_seconds_.survey - begin_seconds_.restore - begin_seconds_.repair);
  char repairs[64] = "";
  if (begin_seconds_.repair >= 0.005) std::snprintf(repairs, sizeof repairs, ", repairs %.2f", begin_seconds_.repair);
  char line[512];
  std::snprintf(line, sizeof line,
                "resumed in %.2f s: exec and libraries %.2f%s, config %.2f, job, data and model %.2f, survey %.2f "
                "(%zu %s in %zu %s%s), restore %.2f%s, first step %.2f",
                exec + seconds_between(g_process_start, now), exec, g_exec_to_start < 0 ? " (unknown)" : "",
                seconds_between(g_process_start, entered_), seconds_between(entered_, started_),
                begin_seconds_.survey + rest_of_begin, copies_surveyed_, copies_surveyed_ == 1 ? "copy" : "copies",
                tiers_surveyed_, tiers_surveyed_ == 1 ? "tier" : "tiers", memory_tier_surveyed_ ? " and the memory tier" : "",
                begin_seconds_.restore, repairs,
                seconds_between(begun_, now));
  std::cout << line << "\n" << std::flush;
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
