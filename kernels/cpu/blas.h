// The CPU path's access to BLAS. The engine parallelises over fixed chunks of the
// batch itself (so results do not depend on the thread count) and calls BLAS from
// inside those parallel regions, so the BLAS library must run single-threaded.
#pragma once
#include <cblas.h>

#include <cstddef>

namespace engine::kernels::cpu {

// Pins the BLAS library to one thread (idempotent, cheap after the first call).
void blas_single_threaded();

// Number of fixed work chunks a batch is split into for reductions over the batch.
// A constant, not the thread count: the summation order, hence the bits, are the
// same on every machine.
inline constexpr int kBatchChunks = 8;

// Per-thread scratch memory that grows and is reused across calls (no zero-filling,
// no page faults on the hot path). `slot` separates buffers used at the same time.
float* thread_scratch(int slot, std::size_t floats);

}  // namespace engine::kernels::cpu
