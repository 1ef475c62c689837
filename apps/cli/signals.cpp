#include "cli/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

#include "cli/exit.h"

namespace engine::cli {
namespace {

// The run the signal handlers talk to (null until the trainer exists, and after fit()).
std::atomic<RunControl*> g_run{nullptr};

void on_stop_signal(int) {
  RunControl* run = g_run.load();
  // A second Ctrl-C (or nothing to save yet): out at once. Saves are atomic (temporary
  // file, fsync, rename), so last.h5 is still the last complete checkpoint. stdout is
  // line-buffered (main), so every line printed so far has reached a redirected log:
  // stdio's fflush is not async-signal-safe, so it cannot be called here.
  if (!run || run->request_stop()) {
    static const char msg[] = "\nengine: interrupted again, exiting now (last.h5 holds the last complete checkpoint)\n";
    if (run) (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(kExitInterrupted);
  }
}

void on_checkpoint_signal(int) {
  if (RunControl* run = g_run.load()) run->request_checkpoint();
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = on_checkpoint_signal;
  sigaction(SIGUSR1, &sa, nullptr);
}

void set_signal_target(RunControl* run) { g_run.store(run); }

}  // namespace engine::cli
