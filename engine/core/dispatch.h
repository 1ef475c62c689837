// Private to the op facade (core/tensor_ops.cpp, core/batchnorm_ops.cpp): picks the
// backend of a kernel from the device its data lives on.
#pragma once
#include "kernels/ops.h"

#define ENGINE_DISPATCH(device, op, ...)                 \
  ((device).is_cuda() ? ::engine::kernels::cuda::op(__VA_ARGS__) \
                      : ::engine::kernels::cpu::op(__VA_ARGS__))
