// Settings of the CUDA backend that the rest of the engine may change (the config's
// cuda.* keys, applied by engine/train/process_settings.cpp). Plain C++ (no CUDA
// headers) so engine/ can include it. Implemented in CUDA builds by
// kernels/cuda/context.cpp (deterministic) and kernels/cuda/chunk_ops.cu (batch_chunks),
// and in kernels/no_cuda.cpp otherwise (the settings are kept, so configs behave the same).
#pragma once

namespace engine::kernels::cuda {

// When on (the default), convolutions use only cuDNN algorithms that cuDNN reports as
// deterministic (same bits on every run), and the algorithm for a shape is chosen by
// cuDNN's heuristics rather than by timing, so the choice itself does not vary between
// runs. When off, the fastest algorithm by measurement is used, deterministic or not.
// Takes effect for shapes planned after the call (plans are cached per setting).
void set_deterministic(bool on);
bool deterministic();

// cuda.batch_chunks: when on (off by default, as in the config), CUDA ops given a batch
// plan compute by the fixed chunks of the batch (the Chunks ops of kernels/op_list.inc;
// the choice is by_chunks in engine/core/batch_plan.h), the same bits at every world
// size; when off, the whole-batch ops (faster, one process only). The CPU always
// computes by chunks. Kept in CPU-only builds as well.
void set_batch_chunks(bool on);
bool batch_chunks();

}  // namespace engine::kernels::cuda
