// The reference's fp32 conv and linear (kernels/ref/reference.cpp): what the ops of the
// op list compute in fp32, and what kernels/ref/mixed_precision.cpp rounds around for
// fp16 and bf16. Private to the reference backend.
#pragma once

#include "kernels/ops.h"

namespace engine::kernels::ref {

void conv2d_forward_fp32(const ConvShape& s, const float* x, const float* w, const float* b, float* y);
void conv2d_backward_fp32(const ConvShape& s, const float* x, const float* w, const float* dy, float* dx, float* dw,
                          float* db);
void linear_forward_fp32(const LinearShape& s, const float* x, const float* w, const float* b, float* y);
void linear_backward_fp32(const LinearShape& s, const float* x, const float* w, const float* dy, float* dx,
                          float* dw, float* db);

}  // namespace engine::kernels::ref
