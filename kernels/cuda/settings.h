// Settings of the CUDA backend that the rest of the engine may change. Plain C++ (no
// CUDA headers) so engine/ and tools/ can include it; implemented in
// kernels/cuda/context.cpp in CUDA builds and in kernels/no_cuda.cpp otherwise (the
// setting is kept, so configs behave the same).
#pragma once

namespace engine::kernels::cuda {

// When on (the default), convolutions use only cuDNN algorithms that cuDNN reports as
// deterministic (same bits on every run), and the algorithm for a shape is chosen by
// cuDNN's heuristics rather than by timing, so the choice itself does not vary between
// runs. When off, the fastest algorithm by measurement is used, deterministic or not.
// Takes effect for shapes planned after the call (plans are cached per setting).
void set_deterministic(bool on);
bool deterministic();

// cuda.batch_chunks: when on (off by default, as in the config), layers given a batch plan compute by the 8
// fixed chunks (kernels/chunk_ops.inc), the same bits at every world size; when off, the
// whole-batch ops (faster, one process only). Kept in CPU-only builds as well.
void set_batch_chunks(bool on);
bool batch_chunks();

}  // namespace engine::kernels::cuda
