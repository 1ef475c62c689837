// Must compile (test layer_walls, the control for core_includes_trainer.cpp): the same
// core-layer settings, including only headers at or below the core layer.
#include "engine/kernels/philox.h"
#include "engine/core/tensor.h"
#include "kernels/ops.h"

int core_probe() { return 0; }
