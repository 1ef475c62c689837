// Test-only: `engine_paused [PAUSE OPTIONS] -- ENGINE ARGS...` is the `engine` program
// (engine::cli::run, the same code as the shipped binary) with a listener that holds
// the run at a chosen step until the test has done what it must do there, so that a
// signal or a kill lands mid-epoch whether a step takes 1 ms or 1 s:
//   --at-step N            hold every rank's training thread after global step N, and
//                          say so on stderr: "engine_paused: rank R (pid P) paused after
//                          step N"
//   --release-after-signals K   release once K of SIGINT, SIGTERM, SIGUSR1 have reached
//                          the process since the pause began (default 1), saying
//                          "engine_paused: rank R saw signal I" for each; each still goes
//                          on to the engine's own handler, so K = 2 holds a run that a
//                          second Ctrl-C ends at once
//   --release-file PATH    release once PATH exists (e.g. after another rank was stopped)
//   --hold-seconds S       release after S seconds
//   --give-up-seconds S    release anyway after S seconds, with a line on stderr, so a
//                          test that never signals does not hang (default 300)
//   --slow-from-step M --step-seconds S
//                          from global step M on, every step takes S seconds more: a run
//                          too slow to end within a --time-limit, by construction
// Built from tests/ only: the shipped CLI has no such options.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine_cli.h"

namespace {

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "engine_paused: %s\nusage: engine_paused [--at-step N] [--release-after-signals K] "
               "[--release-file PATH] [--hold-seconds S] [--give-up-seconds S] [--slow-from-step M "
               "--step-seconds S] -- ENGINE ARGS...\n",
               msg.c_str());
  std::exit(2);
}

// The signals the engine acts on, counted as they arrive and handed on to the handler
// the engine installed (read when the first epoch begins: the CLI installs its own
// before it builds the trainer).
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};
std::atomic<int> g_signals_seen{0};
struct sigaction g_engine_handler[NSIG];

// The engine's handler first, then the count: a handler that ends the process (a second
// Ctrl-C) does so before the pause can hear of the signal and let the run go on.
void count_and_forward(int sig, siginfo_t* info, void* context) {
  const struct sigaction& next = g_engine_handler[sig];
  if (next.sa_flags & SA_SIGINFO) {
    if (next.sa_sigaction) next.sa_sigaction(sig, info, context);
  } else if (next.sa_handler != SIG_DFL && next.sa_handler != SIG_IGN && next.sa_handler) {
    next.sa_handler(sig);
  } else if (next.sa_handler == SIG_DFL) {  // as if we were not here
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  g_signals_seen.fetch_add(1);
}

void chain_signal_handlers() {
  for (int sig : kSignals) {
    struct sigaction sa {};
    sigaction(sig, nullptr, &g_engine_handler[sig]);
    sa.sa_sigaction = count_and_forward;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

struct Options {
  long long at_step = -1;
  int release_after_signals = 1;
  std::string release_file;
  double hold_seconds = -1;
  double give_up_seconds = 300;
  long long slow_from_step = -1;
  double step_seconds = 0;
};

int rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

class Pauser : public engine::TrainerObserver {
 public:
  explicit Pauser(Options o) : o_(std::move(o)) {}

  void on_epoch_begin(int64_t, int64_t, int64_t) override {
    if (chained_) return;
    chain_signal_handlers();
    chained_ = true;
  }

  void on_step_end(int64_t global_step) override {
    if (o_.slow_from_step >= 0 && global_step >= o_.slow_from_step)
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.step_seconds));
    if (global_step == o_.at_step) hold(global_step);
  }

 private:
  void hold(int64_t step) {
    using Clock = std::chrono::steady_clock;
    const int signals_before = g_signals_seen.load();
    std::fprintf(stderr, "engine_paused: rank %d (pid %d) paused after step %lld\n", rank(), ::getpid(),
                 static_cast<long long>(step));
    std::fflush(stderr);
    const auto t0 = Clock::now();
    const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    std::string why;
    int said = 0;
    for (;;) {
      const int seen = g_signals_seen.load() - signals_before;
      for (; said < seen; ++said)  // a test that sends several waits for each to be seen
        std::fprintf(stderr, "engine_paused: rank %d saw signal %d\n", rank(), said + 1), std::fflush(stderr);
      if (seen >= o_.release_after_signals) { why = "signalled"; break; }
      if (!o_.release_file.empty() && std::filesystem::exists(o_.release_file)) { why = "release file"; break; }
      if (o_.hold_seconds >= 0 && waited() >= o_.hold_seconds) { why = "held its time"; break; }
      if (waited() >= o_.give_up_seconds) {
        std::fprintf(stderr, "engine_paused: rank %d: nothing released the pause within %.0f s; going on\n",
                     rank(), o_.give_up_seconds);
        why = "gave up";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::fprintf(stderr, "engine_paused: rank %d released after step %lld (%s)\n", rank(),
                 static_cast<long long>(step), why.c_str());
    std::fflush(stderr);
  }

  Options o_;
  bool chained_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string opt = argv[i];
    if (opt == "--") break;
    if (i + 1 >= argc) usage(opt + " needs a value");
    const char* v = argv[++i];
    try {
      if (opt == "--at-step") o.at_step = std::stoll(v);
      else if (opt == "--release-after-signals") o.release_after_signals = std::stoi(v);
      else if (opt == "--release-file") o.release_file = v;
      else if (opt == "--hold-seconds") o.hold_seconds = std::stod(v);
      else if (opt == "--give-up-seconds") o.give_up_seconds = std::stod(v);
      else if (opt == "--slow-from-step") o.slow_from_step = std::stoll(v);
      else if (opt == "--step-seconds") o.step_seconds = std::stod(v);
      else usage("unknown option '" + opt + "'");
    } catch (const std::logic_error&) {
      usage(opt + ": not a number: '" + v + "'");
    }
  }
  if (i >= argc) usage("no '--' before the engine's arguments");
  // argv[i] is "--": it stands in for the program's name.
  std::vector<char*> engine_argv(argv + i, argv + argc);
  engine_argv[0] = argv[0];
  engine_argv.push_back(nullptr);
  Pauser pauser(o);
  return engine::cli::run(static_cast<int>(engine_argv.size()) - 1, engine_argv.data(), &pauser);
}
