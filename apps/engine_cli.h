// The `engine` program as a function, so that another program can be the CLI with a
// listener of its own (the test harness tests/tools/engine_paused.cpp pauses a run at a
// chosen step this way). apps/engine_main.cpp is `main` over it.
#pragma once
#include "engine/train/trainer.h"

namespace engine::cli {

// Runs `engine argv[1] ...` exactly as the shipped program does and returns its exit
// status (some paths end the process themselves, as the program does: a second Ctrl-C,
// a job-wide abort). `also`, when given, hears every training event after the console.
int run(int argc, char** argv, TrainerObserver* also = nullptr);

}  // namespace engine::cli
