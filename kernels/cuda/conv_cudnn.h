// cuDNN convolutions for every element type the backend uses: one plan cache and one
// algorithm choice (kernels/cuda/conv_cudnn.cpp), shared by the fp32 ops (same file)
// and the fp16 and bf16 ops (kernels/cuda/mixed_precision.cpp). Internal to kernels/cuda.
#pragma once

#include "kernels/ops.h"

namespace engine::kernels::cuda {

// Element type of a convolution's x, w and y (and their gradients).
//  * Float: fp32 tensors, fp32 compute, CUDNN_FMA_MATH (no TF32 tensor cores: they
//    round inputs to 10-bit mantissas); results reporting tensor-op math are skipped.
//  * Half: fp16 tensors, fp32 compute (cuDNN's PSEUDO_HALF configuration), tensor
//    cores allowed; each direction runs with the math type its chosen result reports.
//  * BFloat16: bf16 tensors, fp32 compute (PSEUDO_BFLOAT16; Ampere and newer), tensor
//    cores allowed, as Half.
enum class ConvData { Float, Half, BFloat16 };

// True when the convolution has no work (an empty batch, channel or output extent).
bool conv_is_empty(const ConvShape& s);

// Device pointers to tensors of `data`'s type; results overwrite (beta = 0). The plan
// for (shape, data, deterministic()) is made and its algorithm chosen on first use.
void cudnn_conv_forward(const ConvShape& s, ConvData data, const void* x, const void* w, void* y);
void cudnn_conv_backward_data(const ConvShape& s, ConvData data, const void* w, const void* dy,
                              void* dx);
void cudnn_conv_backward_filter(const ConvShape& s, ConvData data, const void* x, const void* dy,
                                void* dw);

}  // namespace engine::kernels::cuda
