// Mixed-precision (fp16) convolution and linear ops for the CUDA backend, the way
// PyTorch autocast runs them: inputs rounded to fp16, products on tensor cores with
// fp32 accumulation. Same signatures and contracts as the fp32 ops in
// kernels/op_signatures.inc (fp32 device pointers in and out, backward overwrites,
// null dx/bias/db allowed); the fp16 copies live in scratch memory owned by the
// implementation (kernels/cuda/mixed_precision.cpp). Plain C++ (no CUDA headers);
// CPU-only builds get stubs that throw (kernels/no_cuda.cpp).
//
// Precision of each result:
//  * conv2d: x, w and dy are rounded to fp16; cuDNN runs with fp16 tensors and fp32
//    compute (PSEUDO_HALF), so y, dx and dw are fp16 values (as in PyTorch autocast)
//    widened to fp32. A result beyond the fp16 range is +-inf, never clamped.
//  * linear: x, w and dy are rounded to fp16; cuBLAS multiplies them with fp32
//    accumulation and writes fp32 directly, so y, dx and dw carry no fp16 output
//    rounding (and no fp16 range limit on the result).
//  * both: an input beyond the fp16 range (a loss-scaled dy that overflows) becomes
//    inf before the product, so the result holds inf or NaN for the loss scaler.
//  * bias add and bias gradient stay fp32 (the fp32 ops' fixed-order kernels).
// Algorithm choice follows kernels/cuda/settings.h exactly as the fp32 convolutions
// do, but tensor-core algorithms are allowed; fp16 plans are cached apart from fp32.
#pragma once

#include "kernels/ops.h"

namespace engine::kernels::cuda {

void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b,
                        float* y);
void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db);

void linear_forward_f16(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y);
void linear_backward_f16(const LinearShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db);

}  // namespace engine::kernels::cuda
