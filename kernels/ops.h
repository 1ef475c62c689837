// Backends of every op. `ref` is the readable reference (double accumulation, no
// tricks), `cpu` the fast CPU path (the engine's own GEMM, kernels/cpu/gemm.h, with implicit-GEMM convolutions; OpenMP), `cuda` the GPU path
// (device pointers; present only in CUDA builds, stubs that throw otherwise).
// Tests compare cpu and cuda against ref, never a path against itself.
#pragma once
#include <cstdint>

#include "engine/kernels/philox.h"
#include "engine/kernels/precision.h"
#include "kernels/elementwise.h"
#include "kernels/step_digest.h"

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
  // The channels the separate batch-norm steps (op_list.inc) visit: [c_begin, c_end), -1 for all.
  // A rank's driver walks them in groups that stay in cache between its exchanges; the
  // other ops take every channel.
  int c_begin = 0, c_end = -1;
  int channel_end() const { return c_end < 0 ? c : c_end; }
  bool all_channels() const { return c_begin == 0 && channel_end() == c; }
};

struct PoolShape {
  int n = 0, c = 0, h = 0, w = 0;  // input; output is h/2 x w/2
};

// How an op meets its batch (the op list's Either ops): the whole batch, each backend's
// own whole-batch path (chunks 0, the default); or the fixed chunks of the global batch
// (kernels/chunk_tree.h): `chunks` (1, 2, 4 or 8) local chunks whose first samples in
// the local batch are bounds[0..chunks] (bounds[0] = 0, bounds[chunks] = the batch;
// a chunk may be empty), every cross-sample sum taken over the chunk tree.
struct BatchSplit {
  int chunks = 0;
  const int* bounds = nullptr;
  bool whole() const { return chunks == 0; }
};

// Each backend's declarations of the op list (kernels/op_list.inc): ref and cpu have the
// ops marked Every, cuda every op.
#define ENGINE_OP_DECLARE_Every(name, ret, params) ret name params;
#define ENGINE_OP_DECLARE_CudaOnly(name, ret, params)
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  ENGINE_OP_DECLARE_##backends(name, ret, params)
namespace ref {
#include "kernels/op_list.inc"
}
namespace cpu {
#include "kernels/op_list.inc"
// Channels per group of the batch-norm steps: a group's part of `tensors` inputs (x, or
// x and dy) of shape s within 512 KiB, so that the passes over a group between two
// exchanges read it from cache. A function of the shape only (not of the threads), so
// that every rank given the same shape walks the same groups.
int batchnorm_channel_group(const BatchNormShape& s, int tensors);
}
#undef ENGINE_OP
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) ret name params;
namespace cuda {
#include "kernels/op_list.inc"
}
#undef ENGINE_OP
#undef ENGINE_OP_DECLARE_Every
#undef ENGINE_OP_DECLARE_CudaOnly

}  // namespace engine::kernels
