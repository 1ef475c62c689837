// What the CPU ops share: the fixed chunks of a batch, and per-thread scratch. The
// engine parallelises over fixed chunks of the batch itself (so results do not depend
// on the thread count) and runs its single-threaded GEMM (kernels/cpu/gemm.h) inside
// those parallel regions.
#pragma once
#include <cstddef>

namespace engine::kernels::cpu {

// Number of fixed work chunks a batch is split into for reductions over the batch.
// A constant, not the thread count: the summation order, hence the bits, are the
// same on every machine.
// Per-thread scratch memory that grows and is reused across calls (no zero-filling,
// no page faults on the hot path). `slot` separates buffers used at the same time.
// Per-thread buffers that persist across calls; each op uses the slots it names, and a
// slot is never used by two ops that run one inside the other.
enum class Scratch { Work, Output, ChunkGradients, PaddedImages, kCount };

float* thread_scratch(Scratch slot, std::size_t floats);

}  // namespace engine::kernels::cpu
