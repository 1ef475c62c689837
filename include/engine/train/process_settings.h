// The parts of a Config that hold for the whole process rather than one Trainer (today
// cuda.deterministic, which selects the cuDNN algorithms of every model in the process).
// A host applies them once, before it trains: the CLI does for every command. A Trainer
// does not, so building one changes nothing outside it.
#pragma once
#include "engine/train/config.h"

namespace engine {

void apply_process_settings(const Config& cfg);

}  // namespace engine
