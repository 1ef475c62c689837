#include "cli/console_observer.h"

#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "engine/run/run_session.h"

namespace engine::cli {
namespace {

TrainerObserver* g_also = nullptr;

std::string fmt_seconds(double s) {
  if (s < 0) s = 0;
  char buf[32];
  const int t = static_cast<int>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

}  // namespace

void set_host_observer(TrainerObserver* also) { g_also = also; }

ConsoleObserver::ConsoleObserver() : tty_(::isatty(STDOUT_FILENO) != 0) {}

void ConsoleObserver::on_message(const std::string& m) {
  clear();
  // A warning names its rank and goes to stderr, which every rank keeps (the stdout
  // of ranks other than 0 is discarded).
  const std::string tag = RunSession::rank_tag();
  if (!tag.empty() && m.rfind("warning", 0) == 0) std::cerr << "engine: " + tag + m + "\n" << std::flush;
  else std::cout << m << std::endl;
  if (g_also) g_also->on_message(m);
}

void ConsoleObserver::on_epoch_begin(int64_t epoch, int64_t epochs, int64_t steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  if (g_also) g_also->on_epoch_begin(epoch, epochs, steps);
}

void ConsoleObserver::on_progress(const Progress& p) {
  if (g_also) g_also->on_progress(p);
  if (!tty_) return;
  const int width = 30;
  const int filled = p.steps ? static_cast<int>(width * p.step / p.steps) : width;
  std::ostringstream o;
  o << "\r\033[Kepoch " << p.epoch << "/" << p.epochs << " [" << std::string(filled, '#')
    << std::string(width - filled, '.') << "] " << p.step << "/" << p.steps << "  "
    << std::fixed << std::setprecision(0) << p.samples_per_second << " img/s  eta "
    << fmt_seconds(p.eta_seconds) << "  loss " << std::setprecision(4) << p.running_loss;
  std::cout << o.str() << std::flush;
  bar_shown_ = true;
}

void ConsoleObserver::on_epoch_end(const EpochMetrics& m) {
  clear();
  std::printf("epoch %lld/%lld  train_loss %.4f  val_loss %.4f  val_acc %.2f%%  lr %.3g  %.1fs\n",
              static_cast<long long>(m.epoch), static_cast<long long>(epochs_), m.train_loss,
              m.val_loss, 100.0 * m.val_acc, m.lr, m.epoch_seconds);
  std::fflush(stdout);
  if (g_also) g_also->on_epoch_end(m);
}

void ConsoleObserver::on_step_end(int64_t global_step) {
  if (after_next_step_) {
    std::function<void()> f = std::move(after_next_step_);
    after_next_step_ = nullptr;
    clear();
    f();
  }
  if (g_also) g_also->on_step_end(global_step);
}

void ConsoleObserver::on_checkpoint(const std::string& path, CheckpointKind kind) {
  if (g_also) g_also->on_checkpoint(path, kind);
}

void ConsoleObserver::clear() {
  if (bar_shown_) std::cout << "\r\033[K" << std::flush;
  bar_shown_ = false;
}

void print_test(const EvalResult& t) {
  std::printf("test: loss %.4f  accuracy %.2f%% (%lld images)\n", t.loss, 100.0 * t.accuracy,
              static_cast<long long>(t.count));
}

}  // namespace engine::cli
