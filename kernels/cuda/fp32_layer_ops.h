// The CUDA backend's fp32 conv (cuDNN, conv_cudnn.cpp) and linear (cuBLAS,
// linear_cublas.cpp): the op list's conv and linear ops in fp32, which
// kernels/cuda/mixed_precision.cpp calls for p = Fp32. Private to the CUDA backend.
#pragma once

#include "kernels/ops.h"

namespace engine::kernels::cuda {

void conv2d_forward_fp32(const ConvShape& s, const float* x, const float* w, const float* b, float* y);
void conv2d_backward_fp32(const ConvShape& s, const float* x, const float* w, const float* dy, float* dx, float* dw,
                          float* db);
void linear_forward_fp32(const LinearShape& s, const float* x, const float* w, const float* b, float* y);
void linear_backward_fp32(const LinearShape& s, const float* x, const float* w, const float* dy, float* dx,
                          float* dw, float* db);

}  // namespace engine::kernels::cuda
