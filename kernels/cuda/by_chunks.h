// The CUDA backend's chunked split of the op list's Either ops (kernels/cuda/chunk_ops.cu):
// each op's entry (mixed_precision.cpp, elementwise_ops.cu) calls these when it is given
// chunks rather than the whole batch. Private to the CUDA backend.
#pragma once

#include "kernels/ops.h"

namespace engine::kernels::cuda {

// Chunk by chunk, each chunk the whole-batch op over its samples.
void conv2d_forward_by_chunks(const ConvShape& s, Precision p, int chunks, const int* bounds, const float* x,
                              const float* w, const float* b, float* y);
void linear_forward_by_chunks(const LinearShape& s, Precision p, int chunks, const int* bounds, const float* x,
                              const float* w, const float* b, float* y);
// The batch-norm steps with the finish on the host, exactly what BatchNorm2d does with
// exchanges in between (so W = 1 and W > 1 give the same bits).
void batchnorm_forward_train_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                       const float* gamma, const float* beta, float eps, float momentum,
                                       float* running_mean, float* running_var, float* save_mean,
                                       float* save_invstd, float* y);
void batchnorm_backward_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                  const float* dy, const float* gamma, const float* save_mean,
                                  const float* save_invstd, float* dx, float* dgamma, float* dbeta);

}  // namespace engine::kernels::cuda
