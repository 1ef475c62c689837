// Must NOT compile (test layer_walls): a file of the core layer that includes the
// trainer, three layers up. Built with exactly the core layer's include view.
#include "engine/core/tensor.h"
#include "engine/train/trainer.h"

int core_probe() { return 0; }
