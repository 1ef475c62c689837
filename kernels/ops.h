// Backends of every op. `ref` is the readable reference (double accumulation, no
// tricks), `cpu` the fast CPU path (im2col + BLAS, OpenMP), `cuda` the GPU path
// (device pointers; present only in CUDA builds, stubs that throw otherwise).
// Tests compare cpu and cuda against ref, never a path against itself.
#pragma once
#include <cstdint>

#include "engine/kernels/philox.h"
#include "kernels/elementwise.h"

namespace engine::kernels {

// Stride-1 convolution with symmetric zero padding.
struct ConvShape {
  int n = 0, c = 0, h = 0, w = 0;  // input
  int k = 0, r = 0, s = 0;         // output channels, kernel height/width
  int pad = 0;
  int out_h() const { return h + 2 * pad - r + 1; }
  int out_w() const { return w + 2 * pad - s + 1; }
};

struct LinearShape {
  int n = 0, in = 0, out = 0;
};

struct BatchNormShape {
  int n = 0, c = 0, hw = 0;
};

struct PoolShape {
  int n = 0, c = 0, h = 0, w = 0;  // input; output is h/2 x w/2
};

namespace ref {
#include "kernels/op_signatures.inc"
#include "kernels/chunk_ops.inc"
}
namespace cpu {
#include "kernels/op_signatures.inc"
#include "kernels/chunk_ops.inc"
}
namespace cuda {
#include "kernels/op_signatures.inc"
#include "kernels/chunk_ops.inc"
#include "kernels/cuda_f16_ops.inc"
}

}  // namespace engine::kernels
