// The fixed partition of the CUDA backend's per-channel reductions (batch-norm
// statistics and gradients, the conv/linear bias gradient), in plain C++ so that the
// CPU can follow the same order: tests/gpu/reduction_bounds.h emulates it on the host
// to check that the tolerances tests/ops/ applies on cuda are derived right.
// No CUDA headers: ENGINE_HD is __host__ __device__ under nvcc, inline elsewhere.
//
// Channel ch of an [n, c, hw] tensor holds m = n * hw elements; element e (0 <= e < m)
// is x[((e / hw) * c + ch) * hw + e % hw]. A reduction over a channel is split into
// channel_slices(m) slices of slice_length(m, slices) consecutive elements (the last
// one may be shorter, or empty). Block (ch, s) of a (c, slices) grid reduces slice s:
// thread t adds elements begin + t, begin + t + kReduceThreads, ... in that order, then
// the block adds the threads' values in a fixed tree (half = kReduceThreads / 2, ..., 1:
// value[t] += value[t + half]). The slice partials are then added in slice order,
// starting from 0.0. All of it in double. Both numbers depend only on m, never on the
// GPU, so the order is the same everywhere.
#pragma once
#include <cstdint>

#include "engine/kernels/hd.h"

namespace engine::kernels::cuda {

// Threads per block of every kernel (a power of two: the tree relies on it).
constexpr int kReduceThreads = 256;
// At most this many slices per channel (grid y), and at least this many elements per
// slice (4 per thread), so small channels are not spread thinner than pays.
constexpr int kMaxSlices = 32;
constexpr int64_t kMinSliceElements = 1024;

ENGINE_HD int channel_slices(int64_t m) {
  const int64_t wanted = (m + kMinSliceElements - 1) / kMinSliceElements;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > kMaxSlices ? kMaxSlices : wanted));
}

ENGINE_HD int64_t slice_length(int64_t m, int slices) { return (m + slices - 1) / slices; }

}  // namespace engine::kernels::cuda
