// SIGINT/SIGTERM stop a run after the current step, last.h5 saved (a second one exits at
// once); SIGUSR1 asks for a checkpoint and training goes on (docs/cli.md).
#pragma once
#include "engine/train/run_control.h"

namespace engine::cli {

// Installed before anything is loaded, so an early SIGUSR1 is not fatal (its default).
void install_signal_handlers();

// The run the handlers talk to: set while fit() runs, null otherwise (then a stop signal
// exits at once).
void set_signal_target(RunControl* run);

}  // namespace engine::cli
