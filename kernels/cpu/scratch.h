// The CPU ops' per-thread scratch. The engine parallelises over fixed chunks of the
// batch itself (kernels/chunk_tree.h: the results do not depend on the thread count)
// and runs its single-threaded GEMM (kernels/cpu/gemm.h) inside those parallel regions,
// each thread with buffers of its own.
#pragma once
#include <cstddef>

namespace engine::kernels::cpu {

// Per-thread scratch memory that grows and is reused across calls (no zero-filling,
// no page faults on the hot path), 64-byte aligned. Each op uses the slots it names,
// and a slot is never used by two ops that run one inside the other: the GEMM packs
// its operands into PackedA and PackedB while its callers hold the others.
enum class Scratch { Work, Output, ChunkGradients, PaddedImages, PackedA, PackedB, kCount };

float* thread_scratch(Scratch slot, std::size_t floats);

}  // namespace engine::kernels::cpu
